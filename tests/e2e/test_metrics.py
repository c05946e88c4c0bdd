"""End to end: after one text and one image job, the /metrics pages of the two API replicas
and of the two worker processes moved by exactly the right amounts, `promtool check metrics`
passes on every page, and every metric the Grafana dashboard queries exists."""

import time
from pathlib import Path

import httpx
import pytest

from tests.promtext import Samples, families, parse, promtool_check, total

pytestmark = pytest.mark.e2e

FINAL = {"succeeded", "failed", "canceled"}
TEXT = {"task": "text-generation", "model": "tiny-gpt2",
        "input": {"prompts": ["The sun", "A dog"], "max_new_tokens": 4}}
IMAGE = {"task": "image-generation", "model": "tiny-sd",
         "input": {"prompts": ["a red cube"], "num_images_per_prompt": 2, "seed": 3,
                   "width": 64, "height": 64, "steps": 2}}
JOBS = {  # model -> (task, sub-requests)
    "tiny-gpt2": ("text-generation", 2),
    "tiny-sd": ("image-generation", 2),
}
# Phases run once per batch (text: once per group of rows prefilled together), and once per
# item (the SPLIT branch), by model.
BATCH_PHASES = {
    "tiny-gpt2": ("prefill",),
    "tiny-sd": ("prepare", "encode", "denoise", "decode", "to_host", "collect"),
}
ITEM_PHASES = {"tiny-gpt2": ("subrequest",), "tiny-sd": ("png", "subrequest")}


class Pages:
    """Scrapes the two API replicas and the two workers, counting its own API requests."""

    def __init__(self, stack) -> None:
        self.stack = stack
        port = stack.worker_metrics_port
        self.workers = [f"http://127.0.0.1:{port + i}/metrics" for i in range(2)]
        self.scrapes = 0  # GET /metrics on the first API

    def api(self) -> list[tuple[str, Samples]]:
        self.scrapes += 1
        pages = []
        for client in (self.stack.http, self.stack.other):
            r = client.get("/metrics")
            assert r.status_code == 200, r.text
            pages.append((r.text, parse(r.text)))
        return pages

    def workers_up(self) -> bool | None:
        try:
            self.worker()
        except httpx.TransportError:
            return None
        return True

    def worker(self) -> list[tuple[str, Samples]]:
        pages = []
        for url in self.workers:
            r = httpx.get(url, timeout=10)
            assert r.status_code == 200, r.text
            pages.append((r.text, parse(r.text)))
        return pages


def _samples(pages):
    return [s for _, s in pages]


def _until(what: str, check, timeout: float = 30.0):
    """Counters move just after the effect a client sees (a worker counts a sub-request once
    its result is stored; the replica that finalized a job counts it right after): poll."""
    deadline = time.time() + timeout
    while True:
        value = check()
        if value is not None:
            return value
        if time.time() > deadline:
            raise AssertionError(f"{what}: not reached in {timeout}s")
        time.sleep(0.1)


def test_one_text_and_one_image_job_move_the_metrics_by_the_right_amounts(stack):
    pages = Pages(stack)
    # The workers serve /metrics once their models are loaded, around when they turn ready.
    _until("worker /metrics up", pages.workers_up)
    api_before, workers_before = _samples(pages.api()), _samples(pages.worker())

    polls = 0
    ids = []
    for body in (TEXT, IMAGE):
        ids.append(stack.submit(body)["id"])
    for job_id in ids:
        deadline = time.time() + 120
        while True:
            polls += 1
            job = stack.http.get(f"/v1/jobs/{job_id}").json()
            if job["status"] in FINAL:
                break
            assert time.time() < deadline, job
            time.sleep(0.05)
        assert job["status"] == "succeeded", job

    def api_delta(after, name, before=api_before, **labels):
        return total(after, name, **labels) - total(before, name, **labels)

    def worker_delta(after, name, **labels):
        return total(after, name, **labels) - total(workers_before, name, **labels)

    # The API: every job counted once, on whichever replica did it.
    def finished():
        after = _samples(pages.api())
        done = api_delta(after, "fibermill_jobs_finished_total")
        return after if done >= len(JOBS) else None

    api_after = _until("jobs counted finished", finished)
    for model, (task, _n) in JOBS.items():
        labels = {"task": task, "model": model}
        assert api_delta(api_after, "fibermill_jobs_submitted_total", **labels) == 1
        assert api_delta(api_after, "fibermill_jobs_finished_total", **labels) == 1
        assert api_delta(api_after, "fibermill_jobs_finished_total", status="succeeded",
                         **labels) == 1
        for hist in ("job_duration", "job_queue", "job_run"):
            name = f"fibermill_{hist}_seconds"
            assert api_delta(api_after, f"{name}_count", **labels) == 1, name
            assert api_delta(api_after, f"{name}_bucket", le="+Inf", **labels) == 1, name
            assert api_delta(api_after, f"{name}_sum", **labels) > 0, name
        # Nothing is left outstanding: the backlog is back to 0, on every replica alike.
        for page in api_after:
            assert total(page, "fibermill_subrequests_backlog", model=model) == 0
            assert total(page, "fibermill_queue_depth", model=model) == 0
    for page in api_after:
        assert total(page, "fibermill_subrequests_running") == 0
    # HTTP, on the replica this test talked to.
    first, first_before = [api_after[0]], [api_before[0]]
    http = "fibermill_http_requests_total"
    assert api_delta(first, http, first_before, method="POST", route="/v1/jobs",
                     code="202") == len(JOBS)
    assert api_delta(first, http, first_before, method="GET", route="/v1/jobs/{job_id}",
                     code="200") == polls
    # Every scrape but the last, which is not yet counted on its own page.
    assert api_delta(first, http, first_before, method="GET", route="/metrics",
                     code="200") == pages.scrapes - 1
    assert api_delta(first, "fibermill_http_request_duration_seconds_count", first_before,
                     method="GET", route="/v1/jobs/{job_id}") == polls

    # The workers, summed over both processes.
    def worked():
        after = _samples(pages.worker())
        return after if all(
            worker_delta(after, "fibermill_worker_subrequests_total", model=m) >= n
            for m, (_, n) in JOBS.items()
        ) else None

    workers_after = _until("sub-requests counted by the workers", worked)
    for model, (_, n) in JOBS.items():
        sub = "fibermill_worker_subrequests_total"
        assert worker_delta(workers_after, sub, model=model, outcome="succeeded") == n
        assert worker_delta(workers_after, sub, model=model) == n  # no other outcome
        batches = worker_delta(workers_after, "fibermill_batch_size_count", model=model)
        assert batches >= 1, f"{model}: no batch counted"
        assert batches <= n, f"{model}: {batches} batches for {n} sub-requests"
        assert worker_delta(workers_after, "fibermill_batch_size_sum", model=model) == n
        phase = "fibermill_phase_duration_seconds_count"
        for name in BATCH_PHASES[model]:
            assert worker_delta(workers_after, phase, model=model, phase=name) == batches, name
        for name in ITEM_PHASES[model]:
            assert worker_delta(workers_after, phase, model=model, phase=name) == n, name
        leases = worker_delta(workers_after, "fibermill_buffer_leases_total", model=model)
        syncs = worker_delta(workers_after, "fibermill_device_syncs_total", model=model,
                             reason="output")
        if model == "tiny-sd":
            # One buffer set leased, and one device-to-host copy of the outputs, per batch.
            assert (leases, syncs) == (batches, batches)
        else:
            # Text decodes in fixed cache slots, reading its tokens once per iteration.
            iterations = worker_delta(workers_after, phase, model=model, phase="decode")
            assert leases == 0 and syncs == iterations >= 1
        for page in workers_after:
            assert total(page, "fibermill_model_load_seconds", model=model) > 0
            if model == "tiny-sd":  # text has no buffer pool
                assert total(page, "fibermill_buffer_adhoc_live", model=model) == 0
                assert any(n_ == "fibermill_buffer_free_sets" and ("model", model) in ls
                           for n_, ls in page)
    for page in workers_after:
        assert total(page, "fibermill_worker_in_flight") == 0
        # CPU workers: the device memory series exist, for device="cpu", at 0.
        for name in ("allocated", "reserved"):
            series = {ls: v for (n_, ls), v in page.items()
                      if n_ == f"fibermill_device_memory_{name}_bytes"}
            assert series == {frozenset({("device", "cpu")}): 0.0}, series

    # Every page passes promtool's lint.
    for text, _ in pages.api() + pages.worker():
        promtool_check(text)


def test_every_metric_the_dashboard_queries_is_exported(stack):
    """After a text and an image job, each name the Grafana dashboard uses is on the /metrics
    page of an API replica or of a worker."""
    dashboard_module = Path(__file__).resolve().parents[1] / "deploy" / "dashboard.py"
    assert dashboard_module.is_file(), "tests/deploy/dashboard.py is missing"
    from tests.deploy.dashboard import dashboard_metric_names

    for body in (TEXT, IMAGE):
        assert stack.run(body)["status"] == "succeeded"
    pages = Pages(stack)
    _until("worker /metrics up", pages.workers_up)
    exported: set[str] = set()
    for text, _ in pages.api() + pages.worker():
        exported |= set(families(text))
    missing = sorted(dashboard_metric_names() - exported)
    assert missing == [], f"the dashboard queries metrics no /metrics page exports: {missing}"
