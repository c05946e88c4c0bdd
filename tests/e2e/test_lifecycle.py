"""Cancellation and the live event stream on the real stack."""

import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shared import names
from shared.jobstore import lease_owners_in

pytestmark = pytest.mark.e2e


def _metric(text: str, name: str, **labels) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def _leases(stack, job_id: str) -> list[str]:
    return [f"{job_id}:{i}" for i in lease_owners_in(stack.redis.hgetall(names.job_key(job_id)))]


def test_cancel_a_queued_job_runs_nothing(stack):
    # Both workers are kept busy, so the last job waits in the queue when it is canceled.
    busy = [
        stack.submit(
            {
                "task": "image-generation",
                "model": "digits",
                "input": {"prompts": ["1", "2"], "steps": 400},
            }
        )
        for _ in range(2)
    ]
    queued = stack.submit(
        {"task": "image-generation", "model": "digits", "input": {"prompts": ["3"], "steps": 50}}
    )
    job = stack.http.post(f"/v1/jobs/{queued['id']}/cancel").json()
    assert job["status"] == "canceled" and job["started_at"] is None
    for b in busy:
        stack.http.post(f"/v1/jobs/{b['id']}/cancel")
    time.sleep(1.5)
    after = stack.http.get(f"/v1/jobs/{queued['id']}").json()
    assert after["status"] == "canceled" and after["started_at"] is None
    assert stack.redis.hlen(names.results_key(queued["id"])) == 0


def test_cancel_a_running_job_stops_within_two_steps(stack):
    port = stack.worker_metrics_port
    job = stack.submit(
        {"task": "image-generation", "model": "digits", "input": {"prompts": ["8"], "steps": 1000}}
    )
    deadline = time.time() + 30
    while time.time() < deadline and not _leases(stack, job["id"]):
        time.sleep(0.02)
    assert _leases(stack, job["id"]), "the job never started"
    time.sleep(0.3)  # some steps in
    t0 = time.monotonic()
    resp = stack.http.post(f"/v1/jobs/{job['id']}/cancel").json()
    assert resp["status"] == "canceled"
    while _leases(stack, job["id"]) and time.monotonic() - t0 < 10:
        time.sleep(0.005)
    freed = time.monotonic() - t0
    assert not _leases(stack, job["id"])
    # The worker counts how many steps ran after the stop was asked for.
    texts = [httpx.get(f"http://127.0.0.1:{port + i}/metrics").text for i in range(2)]
    count = sum(_metric(t, "fibermill_steps_after_stop_count", model="digits") for t in texts)
    within2 = sum(
        _metric(t, "fibermill_steps_after_stop_bucket", model="digits", le="2.0") for t in texts
    )
    assert count >= 1 and within2 == count, texts
    print(f"cancel freed the worker after {freed * 1000:.0f} ms")
    # The worker serves the next job.
    assert (
        stack.run(
            {"task": "image-generation", "model": "digits", "input": {"prompts": ["8"], "steps": 5}}
        )["status"]
        == "succeeded"
    )


def test_event_stream_ends_with_the_final_status_in_order(stack):
    job = stack.submit(
        {
            "task": "text-generation",
            "model": "tiny-gpt2",
            "input": {"prompts": ["one", "two", "three"], "max_new_tokens": 30},
        }
    )
    events = []
    with stack.http.stream("GET", f"/v1/jobs/{job['id']}/events", timeout=60) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in resp.iter_lines():
            if line.startswith("event:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and name:
                events.append((name, json.loads(line.split(":", 1)[1])))
    statuses = [d["status"] for n, d in events if n == "status"]
    assert events[0][0] == "status"
    assert events[-1][0] == "status" and statuses[-1] == "succeeded"
    order = ["queued", "running", "succeeded"]
    assert [order.index(s) for s in statuses] == sorted(order.index(s) for s in statuses)
    assert len(set(statuses)) == len(statuses)
    done = [d["done"] for n, d in events if n == "progress"]
    assert done == sorted(done) and all(1 <= d <= 3 for d in done)
    # A client that connects late gets the final state at once.
    with stack.http.stream("GET", f"/v1/jobs/{job['id']}/events", timeout=10) as resp:
        late = [ln for ln in resp.iter_lines() if ln.startswith("event:")]
    assert late == ["event: status"]


def test_prefer_wait_returns_the_final_job(stack):
    r = stack.http.post(
        "/v1/jobs",
        headers={"Prefer": "wait=30"},
        json={
            "task": "text-generation",
            "model": "tiny-gpt2",
            "input": {"prompts": ["hi"], "max_new_tokens": 3},
        },
    )
    assert r.status_code == 200 and r.json()["status"] == "succeeded"
