"""One OpenTelemetry trace per job, across real processes: the API and a CPU worker export to
a real OTLP/HTTP receiver (tests/e2e/otlp_receiver.py), configured by OTEL_* variables alone.
A two-prompt job's trace holds the API's spans (the request, which is the job's submit, the
join, the webhook) and the worker's (per prompt its wait in the queue, its lease, and its batch: its
device steps), joined into one tree; the job's status, its timeline and its
webhook name the trace."""

import time
from datetime import datetime

import pytest
import redis

from services.devstack.redis_server import free_port
from tests.e2e.conftest import launch_stack
from tests.e2e.otlp_receiver import Receiver, Span

pytestmark = pytest.mark.e2e

API, WORKER = "fibermill-api", "fibermill-worker"
PER_PROMPT = ["fibermill.queue", "fibermill.lease", "fibermill.batch"]


@pytest.fixture(scope="module")
def traced(redis_server, model_dir, tmp_path_factory):
    redis.Redis.from_url(redis_server.url).flushdb()
    with Receiver() as receiver:
        env = {
            "FIBERMILL_REDIS_URL": redis_server.url,
            "FIBERMILL_MODEL_REGISTRY": str(model_dir / "registry.yaml"),
            "FIBERMILL_CPU_WORKERS": "1",
            "FIBERMILL_WORKER_MODELS": "tiny-gpt2",
            "FIBERMILL_WORKER_METRICS_PORT": str(free_port()),
            "FIBERMILL_WEBHOOK_ALLOW_PRIVATE": "true",
            "FIBERMILL_LOG_LEVEL": "WARNING",
            "OMP_NUM_THREADS": "1",
            # The standard variables, and nothing of Fibermill's own, turn tracing on.
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "100",  # export within a tenth of a second
        }
        with launch_stack(env, tmp_path_factory.mktemp("tracing"), apis=1, workers=1) as s:
            yield s, receiver


def _spans(receiver: Receiver, trace_id: str, want: dict[str, int],
           timeout: float = 20) -> list[Span]:
    """The trace's spans once it holds at least `want[name]` spans of each name (the services
    export in batches, a moment after a span ends)."""
    deadline = time.monotonic() + timeout
    while True:
        spans = receiver.trace(trace_id)
        names = [s.name for s in spans]
        if all(names.count(n) >= k for n, k in want.items()) or time.monotonic() > deadline:
            return spans
        time.sleep(0.1)


def _at(ts: str | None) -> float:
    assert ts is not None
    return datetime.fromisoformat(ts).timestamp()


def test_a_two_prompt_job_is_one_trace_across_both_services(traced):
    stack, receiver = traced
    job = stack.run({"task": "text-generation", "model": "tiny-gpt2",
                     "input": {"prompts": ["Hello there", "The dog"], "max_new_tokens": 4},
                     "webhook": f"{receiver.url}/hook"})
    assert job["status"] == "succeeded", job
    trace_id = job["trace_id"]
    assert isinstance(trace_id, str) and len(trace_id) == 32 and int(trace_id, 16)

    want = {"POST /v1/jobs": 1, "fibermill.join": 1,
            "fibermill.webhook": 1,
            **{name: 2 for name in PER_PROMPT}}
    spans = _spans(receiver, trace_id, want)
    names = [s.name for s in spans]
    for name, k in want.items():
        assert names.count(name) >= k, (name, sorted(names))
    by_id = {s.span_id: s for s in spans}
    assert {s.service for s in spans} == {API, WORKER}
    for s in spans:
        side = WORKER if s.name in PER_PROMPT else API
        assert s.service == side, s

    # One tree: a single root (the POST's server span, which is the job's submit), every
    # other span's parent in it.
    roots = [s for s in spans if not s.parent_id]
    assert [r.name for r in roots] == ["POST /v1/jobs"]
    assert all(s.parent_id in by_id for s in spans if s.parent_id)
    assert "fibermill.submit" not in names
    submit = roots[0]
    assert submit.attributes["fibermill.job_id"] == job["id"]
    assert submit.attributes["fibermill.model"] == "tiny-gpt2"
    assert submit.attributes["fibermill.outputs"] == 2
    # The worker's spans found their parent in the sub-request's traceparent: the submit.
    for s in spans:
        if s.name in ("fibermill.queue", "fibermill.lease"):
            assert s.parent_id == submit.span_id, s

    def children(parent: Span, name: str) -> list[Span]:
        return [s for s in spans if s.parent_id == parent.span_id and s.name == name]

    for index in (0, 1):
        # The spans under the submit name their sub-request; those under its lease are its.
        mine = {s.name: s for s in spans if s.attributes.get("fibermill.index") == index}
        assert set(mine) == {"fibermill.queue", "fibermill.lease"}, (index, sorted(mine))
        queue, lease = mine["fibermill.queue"], mine["fibermill.lease"]
        (batch,) = children(lease, "fibermill.batch")
        assert lease.attributes["fibermill.outcome"] == "succeeded"
        assert lease.attributes["fibermill.attempt"] == 1
        assert lease.attributes["fibermill.job_final"] is False  # the join makes it final
        assert lease.attributes["fibermill.job_id"] == job["id"]
        assert batch.attributes["fibermill.batch.size"] >= 1
        assert batch.attributes["fibermill.steps"] >= 1
        # The sub-requests its batch started with: the leader links to the others' lease
        # spans, the others to the leader's.
        for linked_trace, linked_span in batch.links:
            assert by_id[linked_span].name == "fibermill.lease" and linked_trace == trace_id
        assert queue.start_ns >= submit.start_ns and queue.end_ns <= lease.start_ns + 10**6
        assert lease.start_ns <= batch.start_ns <= batch.end_ns <= lease.end_ns

    (hook,) = [s for s in spans if s.name == "fibermill.webhook"]
    assert hook.attributes["fibermill.webhook.verdict"] == "delivered"
    assert [w["trace_id"] for w in receiver.webhooks if w["id"] == job["id"]] == [trace_id]

    # The timeline, from the job's record: every prompt leased, started and finished in order.
    timed = stack.http.get(f"/v1/jobs/{job['id']}", params={"include": "timeline"}).json()
    assert timed["trace_id"] == trace_id and len(timed["timeline"]) == 2
    assert stack.http.get(f"/v1/jobs/{job['id']}").json()["timeline"] is None
    for index, t in enumerate(timed["timeline"]):
        assert t["index"] == index and t["attempts"] == 1 and t["worker"]
        # Redis's clock and the worker's, one machine's: within a few milliseconds.
        assert _at(t["queued_at"]) <= _at(t["leased_at"]) <= _at(t["started_at"]) + 0.05
        assert _at(t["started_at"]) <= _at(t["finished_at"])
    assert stack.http.get(f"/v1/jobs/{job['id']}",
                          params={"include": "everything"}).status_code == 422


def test_a_callers_traceparent_makes_the_job_part_of_its_trace(traced):
    stack, receiver = traced
    caller = "4bf92f3577b34da6a3ce929d0e0e4736"
    r = stack.http.post("/v1/jobs", headers={
        "traceparent": f"00-{caller}-00f067aa0ba902b7-01", "Prefer": "wait=30"},
        json={"task": "text-generation", "model": "tiny-gpt2",
              "input": {"prompts": ["A"], "max_new_tokens": 2}})
    job = r.json()
    assert job["status"] == "succeeded" and job["trace_id"] == caller
    # The server span ends after its response is sent, so it may reach the receiver last.
    spans = _spans(receiver, caller,
                   {"fibermill.lease": 1, "POST /v1/jobs": 1})
    (lease,) = [s for s in spans if s.name == "fibermill.lease"]
    # A one-prompt text job becomes final in the script that stores its result: no join.
    assert lease.attributes["fibermill.job_final"] is True
    assert "fibermill.join" not in {s.name for s in spans}
    (server,) = [s for s in spans if s.name == "POST /v1/jobs"]
    assert server.parent_id == "00f067aa0ba902b7"
