"""The API's /metrics: HTTP requests by route template (bounded labels), queue depth per priority
list, the backlog from submit to every way a job ends, and job counters moved once per job."""

import asyncio
import uuid

import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

from services.api.app import create_app
from services.api.http_metrics import method_label
from services.api.lifecycle import Lifecycle
from shared.celery_config import PRIORITY_STEPS
from shared.job import JobError, JobMeta, JobStatus
from shared.jobstore import NewJob
from shared.messages import SubRequest, SubResult, TextItem
from shared.registry import load_registry
from tests.conftest import backlog
from tests.promtext import label_values, parse, promtool_check, total

TEXT = {"task": "text-generation", "model": "tiny-gpt2"}


@pytest.fixture
def client(settings_env):
    with TestClient(create_app()) as c:
        yield c


def scrape(client: TestClient):
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    return parse(r.text)


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# HTTP ---------------------------------------------------------------------------------------


def test_http_requests_are_labelled_by_route_template_never_by_path(client):
    before = scrape(client)
    ids = [uuid.uuid4().hex for _ in range(3)]
    for job_id in ids:
        assert client.get(f"/v1/jobs/{job_id}").status_code == 404  # a route's own 404
    for job_id in ids[:2]:
        assert client.get(f"/v1/jobs/{job_id}/outputs/0").status_code == 404
    assert client.get("/no/such/path").status_code == 404
    assert client.get(f"/wp-admin/{ids[0]}.php").status_code == 404
    assert client.get("/static/app.js").status_code == 200
    assert client.get("/static/js/api.js").status_code == 200
    assert client.get("/healthz").status_code == 200
    assert client.delete("/healthz").status_code == 405
    assert client.request("BREW", "/healthz").status_code == 405
    big = b"x" * (2_000_000)  # over the body limit: answered before routing, still templated
    assert client.post("/v1/jobs", content=big,
                       headers={"content-type": "application/json"}).status_code == 413
    after = scrape(client)

    def delta(name, **labels):
        return total(after, name, **labels) - total(before, name, **labels)

    req = "fibermill_http_requests_total"
    assert delta(req, method="GET", route="/v1/jobs/{job_id}", code="404") == 3
    assert delta(req, method="GET", route="/v1/jobs/{job_id}/outputs/{index}", code="404") == 2
    assert delta(req, method="GET", route="unmatched", code="404") == 2
    assert delta(req, method="GET", route="/static/{path}", code="200") == 2
    assert delta(req, method="GET", route="/healthz", code="200") == 1
    assert delta(req, method="DELETE", route="/healthz", code="405") == 1
    assert delta(req, method="other", route="/healthz", code="405") == 1
    assert delta(req, method="POST", route="/v1/jobs", code="413") == 1
    assert delta(req, method="GET", route="/metrics", code="200") == 1  # the first scrape
    dur = "fibermill_http_request_duration_seconds_count"
    assert delta(dur, method="GET", route="/v1/jobs/{job_id}") == 3
    assert delta(dur, method="GET", route="unmatched") == 2
    assert delta("fibermill_http_request_duration_seconds_bucket", method="GET",
                 route="/healthz", le="+Inf") == 1

    # Bounded: every route label is a template the app declares (or "unmatched"), no id or
    # raw path ever appears in a label value.
    routes = label_values(after, req, "route")
    declared = set(client.app.openapi()["paths"]) | {"/", "/static/{path}", "unmatched", "/docs",
                                                      "/redoc", "/docs-assets/{path}"}
    assert routes <= declared, routes - declared
    for (name, labels), _ in after.items():
        if name.startswith("fibermill_http_"):
            assert not any(i in v for i in ids for _, v in labels), (name, labels)
    assert label_values(after, req, "method") <= {"GET", "POST", "DELETE", "other", "HEAD",
                                                   "PUT", "PATCH", "OPTIONS"}


def test_method_label_is_bounded():
    assert [method_label(m) for m in ("GET", "POST", "get", "BREW", "")] == [
        "GET", "POST", "other", "other", "other"]


def test_an_unhandled_error_is_counted_as_a_500(settings_env):
    app = create_app()

    @app.get("/boom/{n}")
    async def boom(n: int) -> None:
        raise RuntimeError("boom")

    before = _value("fibermill_http_requests_total", method="GET", route="/boom/{n}", code="500")
    with TestClient(app, raise_server_exceptions=False) as c:
        assert c.get("/boom/1").status_code == 500
    after = _value("fibermill_http_requests_total", method="GET", route="/boom/{n}", code="500")
    assert after - before == 1


# Queue depth and backlog through the API --------------------------------------------------


def test_queue_depth_per_priority_list_and_backlog_from_submit_to_cancel(client, model_dir):
    registry = load_registry(model_dir / "registry.yaml")
    before = scrape(client)
    body = {**TEXT, "input": {"prompts": ["a", "b", "c"], "max_new_tokens": 2}, "priority": 2}
    r = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": "k1"})
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    # A replay of the same request is the same job: not submitted twice.
    assert client.post("/v1/jobs", json=body, headers={"Idempotency-Key": "k1"}).status_code == 200
    page = scrape(client)

    depth = "fibermill_queue_depth"
    for model in registry.models:  # every model, every priority list, even empty ones
        assert label_values({k: v for k, v in page.items()
                             if ("model", model) in k[1]}, depth, "priority") == {
            str(p) for p in PRIORITY_STEPS}
    assert total(page, depth, model="tiny-gpt2", priority="2") == 3
    assert total(page, depth, model="tiny-gpt2") == 3
    assert total(page, "fibermill_subrequests_backlog", model="tiny-gpt2") == 3
    assert total(page, "fibermill_subrequests_backlog", model="tiny-sd") == 0
    sub = "fibermill_jobs_submitted_total"
    labels = {"task": "text-generation", "model": "tiny-gpt2"}
    assert total(page, sub, **labels) - total(before, sub, **labels) == 1
    promtool_check(client.get("/metrics").text)

    assert client.post(f"/v1/jobs/{job_id}/cancel").json()["status"] == "canceled"
    after = scrape(client)
    assert total(after, "fibermill_subrequests_backlog", model="tiny-gpt2") == 0
    # The messages stay on the queue until a worker takes and drops them.
    assert total(after, depth, model="tiny-gpt2", priority="2") == 3
    fin = "fibermill_jobs_finished_total"
    assert total(after, fin, status="canceled", **labels) - total(
        before, fin, status="canceled", **labels) == 1
    count = "fibermill_job_duration_seconds_count"
    assert total(after, count, **labels) - total(before, count, **labels) == 1
    # Canceled before any sub-request started: no queue wait or run time to observe.
    count = "fibermill_job_queue_seconds_count"
    assert total(after, count, **labels) == total(before, count, **labels)


# Every way a job ends: the backlog empties, the job is counted finished once ----------------


def _sub(job_id: str, index: int) -> SubRequest:
    return SubRequest(job_id=job_id, index=index, model="tiny-gpt2",
                      item=TextItem(prompt="a", max_new_tokens=2))


def _ok(index: int) -> SubResult:
    return SubResult(index=index, output={"text": "x", "finish_reason": "length", "tokens": 1},
                     worker="w")


async def _job(store, job_id: str, total_: int, meta: JobMeta | None = None) -> None:
    await store.create(NewJob(job_id, "text-generation", "tiny-gpt2", {"prompts": ["a"] * total_},
                              total_, meta))
    await store.mark_dispatched(job_id)


def _finished(status: str) -> float:
    return _value("fibermill_jobs_finished_total", task="text-generation", model="tiny-gpt2",
                  status=status)


def _observed(name: str) -> float:
    return _value(f"{name}_count", task="text-generation", model="tiny-gpt2")


async def test_success_empties_the_backlog_and_counts_once_across_replicas(store, lifecycle):
    other = Lifecycle(store, lifecycle.notifier, "")  # a second API replica
    await _job(store, "j1", 2)
    finished, duration = _finished("succeeded"), _observed("fibermill_job_duration_seconds")
    queue, run = _observed("fibermill_job_queue_seconds"), _observed("fibermill_job_run_seconds")
    assert (await store.acquire_lease(_sub("j1", 0), "w", 30, 3)).outcome == "acquired"
    await store.store_result("j1", _ok(0))
    assert await backlog(store.redis, "tiny-gpt2") == 1
    await store.store_result("j1", _ok(1))
    assert await backlog(store.redis, "tiny-gpt2") == 0
    # Both replicas' joiners see the last result at once: one finishes the job.
    outcomes = await asyncio.gather(lifecycle.settle("j1"), other.settle("j1"),
                                    lifecycle.settle("j1"))
    assert sorted(map(str, outcomes)) == ["None", "None", "succeeded"]
    assert _finished("succeeded") - finished == 1
    assert _observed("fibermill_job_duration_seconds") - duration == 1
    assert _observed("fibermill_job_queue_seconds") - queue == 1
    assert _observed("fibermill_job_run_seconds") - run == 1


async def test_failure_empties_the_backlog_of_sub_requests_that_never_report(store, lifecycle):
    await _job(store, "j1", 3)
    finished = _finished("failed")
    await store.store_result("j1", SubResult(index=1, worker="w",
                                             error=JobError(code="model_error", message="x")))
    assert await backlog(store.redis, "tiny-gpt2") == 2
    assert await lifecycle.settle("j1") == JobStatus.FAILED
    assert await backlog(store.redis, "tiny-gpt2") == 0
    assert _finished("failed") - finished == 1


async def test_deadline_expiry_empties_the_backlog(store, lifecycle, dispatcher, settings):
    from services.api.janitor import Janitor

    await _job(store, "j1", 2, JobMeta(deadline_seconds=0.01))
    finished = _finished("failed")
    await asyncio.sleep(0.05)
    assert await Janitor(store, dispatcher, lifecycle, settings).sweep() == 1
    rec = await store.get("j1")
    assert (rec.status, rec.error.code) == ("failed", "deadline_exceeded")
    assert await backlog(store.redis, "tiny-gpt2") == 0
    assert _finished("failed") - finished == 1


async def test_dead_lettered_sub_request_leaves_the_backlog(store, lifecycle, dispatcher,
                                                            settings):
    from services.api.janitor import Janitor

    await _job(store, "j1", 1)
    sub = _sub("j1", 0)
    for _ in range(settings.max_attempts):
        await store.acquire_lease(sub, "w", lease_seconds=-1, max_attempts=settings.max_attempts)
        await store.charge_attempts([sub.member], "w")
        await store.claim_expired_leases()
    await store.acquire_lease(sub, "w", lease_seconds=-1, max_attempts=settings.max_attempts + 1)
    assert await Janitor(store, dispatcher, lifecycle, settings).sweep() == 1
    assert await backlog(store.redis, "tiny-gpt2") == 0
