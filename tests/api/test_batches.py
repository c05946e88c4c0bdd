"""/v1/batches on the real app and its driver, against a real Redis with no workers: the tests
finish the batch's jobs themselves. The batch object's shape, a key's own batches only, a run
through to its output and error files, cancel, expiry, a failed input, backoff on a full queue,
and a lapsed lease handing a batch to another replica without a line submitted twice."""

import asyncio
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import redis
from fastapi.testclient import TestClient
from openai.types import Batch
from standardwebhooks import Webhook, WebhookVerificationError

from services.api.app import create_app
from services.api.auth import digest, key_id
from services.api.batches import batch_input
from services.api.batches.driver import BatchDriver
from services.api.batches.driver_parts import (
    FLUSH_LINES,
    TICK_SECONDS,
    DriverConfig,
    DriverParts,
)
from services.api.batches.files import FileStore
from services.api.batches.store import BatchStore
from services.api.events import EventHub
from services.api.submission import Submissions
from services.api.webhooks.keyring import Keyring
from shared import names
from shared.blobstore.local import LocalBlobStore
from shared.errors import ServiceUnavailable
from shared.job import BATCH_PRIORITY, JobStatus
from shared.jobstore import JobStore
from shared.registry import load_registry
from shared.settings import get_settings
from tests.api.conftest import WEBHOOK_SECRET
from tests.api.test_files import KEY_A, KEY_B, A, B, jsonl, line, upload

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
TEXT = {"text": " out", "finish_reason": "length", "tokens": 4, "prompt_tokens": 1}


def _completion(custom_id: str, **extra) -> str:
    return line(custom_id, COMPLETIONS, model="tiny-gpt2", prompt=f"p {custom_id}",
                max_tokens=4, **extra)


def _wait(predicate, timeout: float = 15.0, what: str = "condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _finish_job(r: redis.Redis, job_id: str, outputs: int = 1) -> None:
    """What the joiner would store for a job that succeeded (there are no workers here)."""
    r.hset(names.job_key(job_id), mapping={"status": "succeeded",
                                           "output": json.dumps([TEXT] * outputs),
                                           "completed_at": time.time()})


def _read(client: TestClient, file_id: str, headers: dict) -> list[dict]:
    resp = client.get(f"/v1/files/{file_id}/content", headers=headers)
    assert resp.status_code == 200, resp.text
    return [json.loads(x) for x in resp.text.splitlines()]


@pytest.fixture
def client(settings_env, monkeypatch):
    monkeypatch.setenv("FIBERMILL_API_KEYS", f"{KEY_A},{KEY_B}")
    monkeypatch.setenv("FIBERMILL_BATCH_MAX_IN_FLIGHT", "2")
    get_settings.cache_clear()
    with TestClient(create_app()) as c:
        yield c


def _batch(client: TestClient, content: bytes, headers: dict = A, **extra) -> dict:
    f = upload(client, content, headers).json()
    resp = client.post("/v1/batches", json={"input_file_id": f["id"], "endpoint": COMPLETIONS,
                                            "completion_window": "24h", **extra},
                       headers=headers)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _get(client: TestClient, batch_id: str, headers: dict = A) -> dict:
    return client.get(f"/v1/batches/{batch_id}", headers=headers).json()


def _jobs(r: redis.Redis, batch_id: str) -> dict[int, str]:
    return {int(k): v.decode() for k, v in r.hgetall(names.batch_jobs_key(batch_id)).items()}


def test_a_batch_runs_to_its_output_and_error_files(client, sredis):
    r = sredis
    content = jsonl(
        _completion("a"),
        line("b", CHAT, model="pydoc-gpt2", messages=[{"role": "user", "content": "hi"}],
             max_tokens=4),
        line("c", COMPLETIONS, model="no-such-model", prompt="x"),
        line("d", COMPLETIONS, model="tiny-gpt2", prompt="x", max_tokens=100_000),
        _completion("e", n=2),
    )
    created = _batch(client, content, metadata={"run": "1"})
    batch = Batch.model_validate(created)
    assert batch.id.startswith("batch_") and batch.object == "batch"
    assert batch.status == "validating" and batch.endpoint == COMPLETIONS
    assert batch.completion_window == "24h" and batch.metadata == {"run": "1"}
    assert batch.expires_at == batch.created_at + 24 * 3600
    assert batch.output_file_id is None and batch.errors is None
    assert set(created) == {
        "id", "object", "endpoint", "errors", "input_file_id", "completion_window", "status",
        "output_file_id", "error_file_id", "created_at", "in_progress_at", "expires_at",
        "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
        "cancelled_at", "request_counts", "metadata"}

    # Two lines in flight at most; the invalid ones fail without a job.
    finished: set[str] = set()
    while len(finished) < 3:
        jobs = _wait(lambda: {i: j for i, j in _jobs(r, batch.id).items() if j not in finished},
                     what="a line's job")
        assert len(_jobs(r, batch.id)) <= 2
        for i, job_id in jobs.items():
            job = client.get(f"/v1/jobs/{job_id}", headers=A).json()
            assert job["priority"] == BATCH_PRIORITY  # below every interactive priority
            _finish_job(r, job_id, outputs=2 if i == 4 else 1)
            finished.add(job_id)
    done = _wait(lambda: (b := _get(client, batch.id))["status"] == "completed" and b,
                 what="the batch to complete")
    done = Batch.model_validate(done)
    assert done.request_counts.model_dump() == {"total": 5, "completed": 3, "failed": 2}
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    assert done.in_progress_at <= done.finalizing_at <= done.completed_at

    out = _read(client, done.output_file_id, A)
    assert [x["custom_id"] for x in out] == ["a", "b", "e"]  # in input order
    a, b, e = out
    assert a["id"] == f"batch_req_{a['response']['request_id']}" and a["error"] is None
    assert a["response"]["status_code"] == 200
    assert a["response"]["body"]["object"] == "text_completion"
    assert b["response"]["body"]["object"] == "chat.completion"
    assert b["response"]["body"]["choices"][0]["message"]["content"] == " out"
    assert len(e["response"]["body"]["choices"]) == 2
    errors = {x["custom_id"]: x for x in _read(client, done.error_file_id, A)}
    assert list(errors) == ["c", "d"]
    c, d = errors["c"]["response"], errors["d"]["response"]
    assert c["status_code"] == 404 and c["body"]["error"]["code"] == "model_not_found"
    assert d["status_code"] == 400 and d["body"]["error"]["param"] == "max_tokens"
    for f in (done.output_file_id, done.error_file_id):
        meta = client.get(f"/v1/files/{f}", headers=A).json()
        assert meta["purpose"] == "batch_output"

    # Only the object is kept (with a TTL); the running state is gone.
    _wait(lambda: not r.sismember(names.BATCHES_ACTIVE, batch.id), what="retired")
    assert not r.exists(names.batch_jobs_key(batch.id), names.batch_done_key(batch.id))
    assert 0 < r.ttl(names.batch_key(batch.id)) <= get_settings().file_ttl_seconds
    listed = client.get("/v1/batches", headers=A).json()
    assert [x["id"] for x in listed["data"]] == [batch.id] and listed["has_more"] is False


def test_a_key_sees_only_its_own_batches(client):
    batch = _batch(client, jsonl(_completion("a")))
    for method, path in (("get", f"/v1/batches/{batch['id']}"),
                         ("post", f"/v1/batches/{batch['id']}/cancel")):
        resp = getattr(client, method)(path, headers=B)
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
    assert client.get("/v1/batches", headers=B).json()["data"] == []
    # Nor can it run another key's file.
    f = upload(client, jsonl(_completion("a")), A).json()
    resp = client.post("/v1/batches", json={"input_file_id": f["id"], "endpoint": COMPLETIONS,
                                            "completion_window": "24h"}, headers=B)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "input_file_id"
    assert _get(client, batch["id"])["id"] == batch["id"]


@pytest.mark.parametrize(("change", "param"), [
    ({"completion_window": "48h"}, "completion_window"),
    ({"endpoint": "/v1/embeddings"}, "endpoint"),
    ({"input_file_id": "file-nope"}, "input_file_id"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"metadata": {"k": "v" * 513}}, "metadata.k"),
    ({"output_expires_after": {"anchor": "created_at", "seconds": 3600}},
     "output_expires_after"),
    ({"webhook": "ftp://example.com/x"}, "webhook"),
])
def test_a_batch_that_cannot_run_is_refused_naming_the_field(client, change, param):
    f = upload(client, jsonl(_completion("a")), A).json()
    body = {"input_file_id": f["id"], "endpoint": COMPLETIONS, "completion_window": "24h",
            **change}
    resp = client.post("/v1/batches", json=body, headers=A)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param, resp.json()


def test_cancel_stops_the_batch_and_files_what_finished(client, sredis):
    r = sredis
    batch = _batch(client, jsonl(*(_completion(c) for c in "abcde")))
    jobs = _wait(lambda: len(j := _jobs(r, batch["id"])) == 2 and j, what="two lines running")
    _finish_job(r, jobs[0])
    _wait(lambda: _get(client, batch["id"])["request_counts"]["completed"] == 1,
          what="line a done")
    jobs = _wait(lambda: len(j := _jobs(r, batch["id"])) == 2 and j, what="b and c running")
    assert sorted(jobs) == [1, 2]
    resp = client.post(f"/v1/batches/{batch['id']}/cancel", headers=A)
    assert resp.status_code == 200
    assert resp.json()["status"] == "cancelling" and resp.json()["cancelling_at"]
    done = Batch.model_validate(_wait(
        lambda: (b := _get(client, batch["id"]))["status"] == "cancelled" and b,
        what="cancelled"))
    assert done.cancelled_at >= done.cancelling_at
    assert done.request_counts.model_dump() == {"total": 5, "completed": 1, "failed": 4}
    assert [x["custom_id"] for x in _read(client, done.output_file_id, A)] == ["a"]
    errors = _read(client, done.error_file_id, A)
    assert [x["custom_id"] for x in errors] == ["b", "c", "d", "e"]
    assert {x["error"]["code"] for x in errors} == {"batch_cancelled"}
    assert all(x["response"] is None for x in errors)
    # The running lines' jobs were canceled; the lines never submitted have no job.
    for i in (1, 2):
        assert r.hget(names.job_key(jobs[i]), "status") == b"canceled"
        assert errors[i - 1]["id"] == f"batch_req_{jobs[i]}"
    assert r.zcard(names.jobs_index_key(key_id(digest(KEY_A)))) == 3
    # Cancelling again changes nothing.
    again = client.post(f"/v1/batches/{batch['id']}/cancel", headers=A).json()
    assert again["status"] == "cancelled"


# The driver on its own ------------------------------------------------------------------------


@dataclass
class Env:
    redis: object
    store: JobStore
    files: FileStore
    batches: BatchStore
    blobs: LocalBlobStore
    submissions: Submissions
    lifecycle: object
    registry: object
    settings: object

    def driver(self, name: str, lease_ms: int = 15_000, hub: EventHub | None = None,
               tick_seconds: float = TICK_SECONDS, flush_lines: int = FLUSH_LINES,
               **settings) -> BatchDriver:
        s = self.settings.model_copy(update=settings) if settings else self.settings
        parts = DriverParts(self.batches, self.files, self.blobs, self.store, self.submissions,
                            self.lifecycle, self.registry, hub=hub)
        return BatchDriver(parts, s, name,
                           DriverConfig(tick_seconds=tick_seconds, lease_ms=lease_ms,
                                        flush_lines=flush_lines))

    async def batch(self, n: int, owner: str | None = "k1", **extra) -> str:
        content = jsonl(*(_completion(f"c{i}", **extra) for i in range(n)))
        f = await self.files.create(content, "in.jsonl", "batch", owner, n)
        return (await self.batches.create(f.id, COMPLETIONS, "24h", None, owner))["id"]

    async def jobs(self, batch_id: str) -> dict[int, str]:
        raw = await self.redis.hgetall(names.batch_jobs_key(batch_id))
        return {int(k): v.decode() for k, v in raw.items()}

    async def succeed(self, *job_ids: str) -> None:
        for job_id in job_ids:
            await self.store.finalize(job_id, JobStatus.SUCCEEDED, [TEXT])

    async def lines(self, file_id: str) -> list[dict]:
        meta = await self.files.find(file_id)
        return [json.loads(x) for x in (await self.files.read(meta)).splitlines()]


@pytest.fixture
async def env(aredis, store, settings, dispatcher, lifecycle, tmp_path):
    blobs = LocalBlobStore(tmp_path / "blobs")
    registry = load_registry(settings.model_registry)
    yield Env(aredis, store, FileStore(aredis, blobs, settings.file_ttl_seconds),
              BatchStore(aredis, settings.file_ttl_seconds), blobs,
              Submissions(aredis, store, registry, dispatcher, settings), lifecycle, registry,
              settings)
    await blobs.close()


async def test_a_lapsed_lease_hands_the_batch_over_and_no_line_runs_twice(env):
    batch_id = await env.batch(5)
    one, two = env.driver("one", lease_ms=300), env.driver("two", lease_ms=300)
    await one.tick()  # takes it, validates
    await one.tick()  # submits every line
    first = await env.jobs(batch_id)
    assert sorted(first) == [0, 1, 2, 3, 4]
    await env.succeed(first[0])
    await one.tick()
    assert (await env.batches.find(batch_id))["completed"] == "1"

    await two.tick()
    assert batch_id not in two.held  # its lease is live: one replica drives a batch
    # Replica one dies (stops renewing) having submitted line 3 without recording its job.
    await env.redis.hdel(names.batch_jobs_key(batch_id), 3)
    await asyncio.sleep(0.4)
    await two.tick()
    assert batch_id in two.held
    assert await env.jobs(batch_id) == {i: first[i] for i in (1, 2, 3, 4)}  # the same job
    assert await env.redis.zcard(names.jobs_index_key("k1")) == 5
    await one.tick()  # back from a pause: its lease is gone, it lets go
    assert batch_id not in one.held

    await env.succeed(*(first[i] for i in (1, 2, 3, 4)))
    await two.tick()
    await two.tick()  # the step after the end retires it
    h = await env.batches.find(batch_id)
    assert h["status"] == "completed" and h["completed"] == "5" and h["failed"] == "0"
    out = await env.lines(h["output_file_id"])
    assert [x["custom_id"] for x in out] == [f"c{i}" for i in range(5)]
    assert [x["response"]["request_id"] for x in out] == [first[i] for i in range(5)]
    assert not h.get("error_file_id")
    assert batch_id not in two.held
    assert not await env.redis.exists(names.batch_lease_key(batch_id))


async def test_past_its_window_a_batch_expires_with_what_finished(env):
    batch_id = await env.batch(5)
    driver = env.driver("one", batch_max_in_flight=3)
    await driver.tick()
    await driver.tick()
    jobs = await env.jobs(batch_id)
    assert sorted(jobs) == [0, 1, 2]
    await env.succeed(jobs[0], jobs[1])
    await driver.tick()
    await env.redis.hset(names.batch_key(batch_id), "expires_at", int(time.time()) - 1)
    await driver.tick()
    h = await env.batches.find(batch_id)
    assert h["status"] == "expired" and int(h["expired_at"]) >= int(h["expires_at"])
    assert (h["total"], h["completed"], h["failed"]) == ("5", "2", "3")
    assert [x["custom_id"] for x in await env.lines(h["output_file_id"])] == ["c0", "c1"]
    errors = await env.lines(h["error_file_id"])
    assert [x["custom_id"] for x in errors] == ["c2", "c3", "c4"]
    assert {x["error"]["code"] for x in errors} == {"batch_expired"}
    assert (await env.store.get(jobs[2])).status == JobStatus.CANCELED


async def test_a_batch_whose_input_is_gone_fails(env):
    batch_id = await env.batch(2)
    h = await env.batches.find(batch_id)
    await env.files.delete(await env.files.find(h["input_file_id"]))
    driver = env.driver("one")
    await driver.tick()
    await driver.tick()
    h = await env.batches.find(batch_id)
    assert h["status"] == "failed" and h["failed_at"]
    errors = json.loads(h["errors"])
    assert errors["object"] == "list" and errors["data"][0]["code"] == "file_not_found"
    assert not await env.redis.sismember(names.BATCHES_ACTIVE, batch_id)


async def _running_without_its_input_copy(env: Env, n: int = 2) -> str:
    """A batch in progress whose copy of its input is gone from the blob store, as a replica
    that did not drive it yet would find it."""
    batch_id = await env.batch(n)
    await env.driver("one").tick()  # validates: copies the input, in progress
    await env.batches.release(batch_id, "one")  # and the replica that did so leaves
    h = await env.batches.find(batch_id)
    assert h["status"] == "in_progress" and h["input_key"]
    await env.blobs.delete([h["input_key"]])
    return batch_id


async def test_a_batch_whose_input_copy_is_gone_fails_and_is_not_retried(env):
    batch_id = await _running_without_its_input_copy(env)
    driver = env.driver("two")
    await driver.tick()
    h = await env.batches.find(batch_id)
    assert h["status"] == "failed" and h["failed_at"]
    assert json.loads(h["errors"])["data"][0]["code"] == "file_not_found"
    await driver.tick()  # the step after the end retires it
    assert batch_id not in driver.held
    assert not await env.redis.sismember(names.BATCHES_ACTIVE, batch_id)


async def test_past_its_window_a_batch_without_its_input_copy_expires(env):
    batch_id = await _running_without_its_input_copy(env)
    await env.redis.hset(names.batch_key(batch_id), "expires_at", int(time.time()) - 1)
    driver = env.driver("two")
    await driver.tick()
    h = await env.batches.find(batch_id)
    assert h["status"] == "expired" and h["expired_at"]
    jobs = await env.jobs(batch_id)
    assert len(jobs) == 2
    for job_id in jobs.values():  # submitted by the first replica, canceled by this one
        assert (await env.store.get(job_id)).status == JobStatus.CANCELED
    await driver.tick()
    assert batch_id not in driver.held
    assert not await env.redis.sismember(names.BATCHES_ACTIVE, batch_id)


async def test_past_its_window_a_validating_batch_expires_without_reading_its_input(
        env, monkeypatch):
    batch_id = await env.batch(2)
    await env.redis.hset(names.batch_key(batch_id), "expires_at", int(time.time()) - 1)
    opened: list[str] = []
    real_open = env.blobs.open

    async def spy(key: str):
        opened.append(key)
        return await real_open(key)

    monkeypatch.setattr(env.blobs, "open", spy)
    driver = env.driver("one")
    await driver.tick()
    h = await env.batches.find(batch_id)
    assert h["status"] == "expired" and h["expired_at"]
    assert opened == []
    assert await env.jobs(batch_id) == {}
    await driver.tick()
    assert not await env.redis.sismember(names.BATCHES_ACTIVE, batch_id)


async def test_past_its_window_a_taken_over_batch_names_every_unfinished_line(env):
    batch_id = await env.batch(3)
    await env.driver("one", batch_max_in_flight=2).tick()
    first = await env.jobs(batch_id)
    await env.succeed(first[0])
    await env.batches.release(batch_id, "one")  # the replica that ran it leaves
    await env.redis.hset(names.batch_key(batch_id), "expires_at", int(time.time()) - 1)
    await env.driver("two").tick()
    h = await env.batches.find(batch_id)
    assert h["status"] == "expired"
    assert [x["custom_id"] for x in await env.lines(h["output_file_id"])] == ["c0"]
    errors = await env.lines(h["error_file_id"])
    assert [x["custom_id"] for x in errors] == ["c1", "c2"]
    assert {x["error"]["code"] for x in errors} == {"batch_expired"}
    assert (await env.store.get(first[1])).status == JobStatus.CANCELED


async def test_the_input_file_may_be_deleted_once_the_batch_runs(env):
    batch_id = await env.batch(2)
    driver = env.driver("one")
    await driver.tick()
    h = await env.batches.find(batch_id)
    await env.files.delete(await env.files.find(h["input_file_id"]))
    await driver.tick()
    await env.succeed(*(await env.jobs(batch_id)).values())
    await driver.tick()
    h = await env.batches.find(batch_id)
    assert h["status"] == "completed" and h["completed"] == "2"


async def _until(what: str, check, seconds: float = 10.0):
    deadline = time.monotonic() + seconds
    while not (value := await check()):
        assert time.monotonic() < deadline, f"{what}: not within {seconds}s"
        await asyncio.sleep(0.02)
    return value


async def test_lines_are_written_and_refilled_as_their_jobs_end_not_at_the_next_tick(env):
    """Between ticks (an hour apart here) the driver hears each line's job become final on
    the event hub, writes that line and submits the next; a batch created on this replica
    starts at once, and one whose lines all ended completes."""
    hub = EventHub(env.redis)
    driver = env.driver("one", hub=hub, tick_seconds=3600, batch_max_in_flight=2)
    tasks = [asyncio.create_task(hub.run()), asyncio.create_task(driver.run())]
    try:
        await asyncio.wait_for(hub.connected.wait(), 5)
        await asyncio.sleep(0.1)  # the driver's first tick found nothing and now waits
        batch_id = await env.batch(3)
        first = await _until("two lines submitted", lambda: _submitted(env, batch_id, 2))
        await env.succeed(first[0])
        after = await _until("line 0 written, line 2 submitted",
                             lambda: _submitted(env, batch_id, 2, without=0))
        assert after[1] == first[1] and 2 in after
        assert (await env.batches.find(batch_id))["completed"] == "1"
        await env.succeed(after[1], after[2])
        done = await _until("completed", lambda: _status(env, batch_id, "completed"))
        assert done["completed"] == "3"
        assert [x["custom_id"] for x in await env.lines(done["output_file_id"])] == \
            ["c0", "c1", "c2"]
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _submitted(env: Env, batch_id: str, n: int, without: int | None = None):
    jobs = await env.jobs(batch_id)
    return jobs if len(jobs) == n and without not in jobs else None


async def _status(env: Env, batch_id: str, status: str):
    h = await env.batches.find(batch_id)
    return h if h is not None and h["status"] == status else None


async def test_a_full_queue_puts_lines_off_and_loses_none(env):
    class Flaky:
        """Refuses the first two submissions as a full queue would."""

        def __init__(self, inner: Submissions) -> None:
            self.inner, self.refused = inner, 0

        async def submit(self, *args, **kwargs):
            if self.refused < 2:
                self.refused += 1
                raise ServiceUnavailable("queue full", retry_after=1)
            return await self.inner.submit(*args, **kwargs)

    env.submissions = Flaky(env.submissions)
    batch_id = await env.batch(3)
    driver = env.driver("one", batch_max_in_flight=1)
    await driver.tick()
    await driver.tick()
    assert await env.jobs(batch_id) == {}
    await driver.tick()  # still backing off: not tried again yet
    assert env.submissions.refused == 1
    deadline = time.time() + 10
    while (h := await env.batches.find(batch_id))["status"] != "completed":
        assert time.time() < deadline, h
        await asyncio.sleep(0.25)
        await driver.tick()
        await env.succeed(*(await env.jobs(batch_id)).values())
    assert env.submissions.refused == 2
    assert h["status"] == "completed" and h["completed"] == "3", h


async def test_a_batch_with_a_webhook_sends_a_signed_event_when_it_ends(env):
    hits: list[tuple[dict, bytes]] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["content-length"]))
            hits.append(({k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(500 if len(hits) == 1 else 200)  # the first attempt fails
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env.settings = env.settings.model_copy(update={
        "webhook_allow_private": True, "webhook_backoff_base_seconds": 0.05})
    try:
        f = await env.files.create(jsonl(_completion("a")), "in.jsonl", "batch", "k1", 1)
        url = f"http://127.0.0.1:{server.server_port}/hook"
        batch_id = (await env.batches.create(f.id, COMPLETIONS, "24h", None, "k1",
                                             webhook=url))["id"]
        driver = env.driver("one")
        await driver.tick()
        await driver.tick()
        await env.succeed(*(await env.jobs(batch_id)).values())
        deadline = time.time() + 10
        while batch_id in driver.held or (not driver.held and len(hits) < 2):
            assert time.time() < deadline, hits
            await driver.tick()
            await asyncio.sleep(0.05)
    finally:
        server.shutdown()
        server.server_close()
    assert len(hits) == 2
    headers, body = hits[-1]
    assert headers["webhook-id"] == hits[0][0]["webhook-id"]  # one event, retried
    # Signed with the secret of the batch's API key, as its jobs' webhooks are.
    (own,) = await Keyring(env.redis, env.settings).secrets("k1")
    event = Webhook(own.secret).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(WEBHOOK_SECRET).verify(body, headers)
    assert event["type"] == "batch.completed" and event["object"] == "event"
    assert event["data"]["id"] == batch_id and event["data"]["status"] == "completed"
    h = await env.batches.find(batch_id)
    assert h["webhook_state"] == "delivered" and h["webhook_attempts"] == "2"
    assert not await env.redis.sismember(names.BATCHES_ACTIVE, batch_id)


async def _run_to_the_end(env: Env, driver: BatchDriver, batch_id: str) -> dict:
    deadline = time.time() + 60
    while True:
        h = await env.batches.find(batch_id)
        assert h is not None
        if h["status"] == "completed":
            return h
        assert time.time() < deadline, h
        await driver.tick()
        await env.succeed(*(await env.jobs(batch_id)).values())


async def test_the_driver_reads_its_input_a_window_at_a_time(env, monkeypatch):
    """A batch of 300 lines (about 60 KiB) run 40 lines at a time through windows of 4 KiB:
    the driver never opens its copy of the input to read it whole; every read of it is a
    ranged read of at most a window; the output is whole and in order."""
    monkeypatch.setattr(batch_input, "WINDOW_BYTES", 4096)
    reads: list[tuple[str, int]] = []
    opened: list[str] = []
    real_range, real_open = env.blobs.read_range, env.blobs.open

    async def read_range(key, start, end):
        got = await real_range(key, start, end)
        reads.append((key, len(got)))
        return got

    async def open_(key):
        opened.append(key)
        return await real_open(key)

    monkeypatch.setattr(env.blobs, "read_range", read_range)
    monkeypatch.setattr(env.blobs, "open", open_)
    batch_id = await env.batch(300, user="u" * 200)
    driver = env.driver("one", batch_max_in_flight=40)
    h = await _run_to_the_end(env, driver, batch_id)
    size = (await env.files.find(h["input_file_id"])).bytes
    assert size > 15 * 4096
    assert h["input_key"] not in opened
    copy = [n for key, n in reads if key == h["input_key"]]
    assert copy and max(copy) <= 4096
    assert sum(copy) < 2 * size  # each line read about once (and a byte to find the copy)
    out = await env.lines(h["output_file_id"])
    assert [x["custom_id"] for x in out] == [f"c{i}" for i in range(300)]


async def _redis_text(r) -> bytes:
    """Every value Redis holds under the batch keys, as one blob of bytes."""
    found = []
    async for key in r.scan_iter("fm:batch:*"):
        kind = (await r.type(key)).decode()
        if kind == "hash":
            found += [k + b"=" + v for k, v in (await r.hgetall(key)).items()]
        elif kind == "list":
            found += await r.lrange(key, 0, -1)
        elif kind == "string":
            found.append(await r.get(key))
    return b"\n".join(found)


async def test_finished_lines_leave_redis_for_the_blob_store_as_they_finish(env):
    batch_id = await env.batch(6)
    driver = env.driver("one", flush_lines=3)
    await driver.tick()
    jobs = await env.jobs(batch_id)
    assert sorted(jobs) == [0, 1, 2, 3, 4, 5]
    await env.succeed(*(jobs[i] for i in (4, 1, 2, 0)))  # out of order
    await driver.tick()
    h = await env.batches.find(batch_id)
    assert h["status"] == "in_progress" and h["completed"] == "4"
    held = await _redis_text(env.redis)
    for i in (0, 1, 2, 4):  # their output lines are in a part, not in Redis
        assert jobs[i].encode() not in held
    for i in (3, 5):  # unfinished: their jobs are
        assert jobs[i].encode() in held
    assert await env.redis.hlen(names.batch_lines_key(batch_id)) == 0
    part_keys = await env.batches.parts(batch_id)
    assert len(part_keys) == 1
    assert jobs[4].encode() in await (await env.blobs.open(part_keys[0])).read()

    await env.succeed(jobs[5], jobs[3])
    await driver.tick()
    h = await env.batches.find(batch_id)
    assert h["status"] == "completed"
    out = await env.lines(h["output_file_id"])
    assert [x["custom_id"] for x in out] == [f"c{i}" for i in range(6)]
    assert [x["response"]["request_id"] for x in out] == [jobs[i] for i in range(6)]
    await driver.tick()  # retired: its parts go with its input
    assert not [k async for k in env.blobs.keys("files/") if ".part-" in k]


async def test_expiry_follows_redis_clock_not_this_hosts(env, monkeypatch):
    """Replicas' clocks disagree; Redis's is the one they share. With this host's clock a day
    and an hour ahead the batch runs on (by Redis it has 24 h left); an hour behind, a batch
    past its window by Redis's clock expires."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 25 * 3600)
    batch_id = await env.batch(3)
    redis_now = await env.batches.now()
    h = await env.batches.find(batch_id)
    assert abs(int(h["created_at"]) - redis_now) < 5
    assert int(h["expires_at"]) == int(h["created_at"]) + 24 * 3600
    driver = env.driver("ahead", batch_max_in_flight=2)
    await driver.tick()
    await driver.tick()
    h = await env.batches.find(batch_id)
    assert h["status"] == "in_progress", h
    assert abs(int(h["in_progress_at"]) - redis_now) < 5  # stamped by Redis too
    assert len(await env.jobs(batch_id)) == 2

    monkeypatch.setattr(time, "time", lambda: real() - 3600)
    await env.redis.hset(names.batch_key(batch_id), "expires_at", int(redis_now) - 1)
    behind = env.driver("behind")
    await driver.batches.release(batch_id, "ahead")
    await behind.tick()
    h = await env.batches.find(batch_id)
    assert h["status"] == "expired", h
    assert abs(int(h["expired_at"]) - redis_now) < 5
    errors = await env.lines(h["error_file_id"])
    assert [x["custom_id"] for x in errors] == ["c0", "c1", "c2"]


async def test_a_batch_an_older_driver_ran_is_taken_over(env):
    """A driver from before kept done lines' file lines in a `done` hash and no index of the
    input: the driver that takes the batch over makes the hash a bitmap (its lines go to a
    part like any other) and the index from the input's copy, and runs the batch on."""
    batch_id = await env.batch(3)
    await env.driver("old").tick()
    jobs = await env.jobs(batch_id)
    await env.batches.release(batch_id, "old")
    entry = {"id": f"batch_req_{jobs[0]}", "custom_id": "c0", "error": None,
             "response": {"status_code": 200, "request_id": jobs[0], "body": {"old": True}}}
    await env.redis.delete(names.batch_done_key(batch_id))
    await env.redis.hset(names.batch_done_key(batch_id), "0", "o" + json.dumps(entry))
    await env.redis.hdel(names.batch_jobs_key(batch_id), "0")
    await env.redis.hincrby(names.batch_key(batch_id), "completed", 1)
    h = await env.batches.find(batch_id)
    await env.blobs.delete([h["index_key"]])
    await env.redis.hdel(names.batch_key(batch_id), "index_key")

    driver = env.driver("new")
    await driver.tick()
    assert await env.redis.type(names.batch_done_key(batch_id)) == b"string"  # a bitmap
    assert (await env.batches.find(batch_id))["index_key"]
    await env.succeed(jobs[1], jobs[2])
    h = await _run_to_the_end(env, driver, batch_id)
    assert (h["completed"], h["failed"]) == ("3", "0")
    out = await env.lines(h["output_file_id"])
    assert [x["custom_id"] for x in out] == ["c0", "c1", "c2"]
    assert out[0] == entry and out[1]["response"]["request_id"] == jobs[1]
