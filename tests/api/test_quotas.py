"""Per-key quotas on a real Redis: open batches (429 naming the quota and the count), stored
file bytes (413 naming the quota and the bytes), and a key's share of a model's queue for batch
work (its lines wait, its batch stays in progress, nothing fails), each per key, with a key's
own override from FIBERMILL_KEY_QUOTAS."""

import asyncio
import json
import time
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient

from services.api import quotas as quotas_module
from services.api.app import create_app
from services.api.auth import Principal, digest, key_id
from services.api.batches.driver import BatchDriver
from services.api.batches.driver_parts import DriverConfig, DriverParts
from services.api.batches.files import FileStore
from services.api.batches.store import BatchStore
from services.api.quotas import Quotas, limits
from services.api.submission import Submissions, Submitted
from shared import names
from shared.blobstore.local import LocalBlobStore
from shared.errors import QuotaExceeded
from shared.job import BATCH_PRIORITY, JobRequest, JobStatus
from shared.queue_depth import batch_depth, batch_list, queue_depth
from shared.registry import load_registry
from shared.settings import KeyQuotas, Settings, get_settings
from tests.api.test_files import KEY_A, KEY_B, A, B, jsonl, line, upload

TEXT = {"text": " out", "finish_reason": "length", "tokens": 4, "prompt_tokens": 1}
ID_A = key_id(digest(KEY_A))


def _line(i: int) -> JobRequest:
    return JobRequest(model="tiny-gpt2", input={"prompts": [f"line {i}"], "max_new_tokens": 2})


def test_a_keys_own_quotas_override_the_defaults():
    s = Settings(max_active_batches_per_key=7, batch_queue_share_per_key=0.5,
                 key_quotas={"k1": KeyQuotas(max_active_batches=2)})
    assert limits(s, "k1").max_active_batches == 2
    assert limits(s, "k1").batch_queue_share == 0.5  # not overridden: the default
    assert limits(s, "k2").max_active_batches == 7


@pytest.fixture
def client(settings_env, monkeypatch):
    monkeypatch.setenv("FIBERMILL_API_KEYS", f"{KEY_A},{KEY_B}")
    monkeypatch.setenv("FIBERMILL_KEY_QUOTAS", json.dumps(
        {ID_A: {"max_active_batches": 2, "max_stored_file_bytes": 1000}}))
    get_settings.cache_clear()
    with TestClient(create_app()) as c:
        yield c


def _create(client: TestClient, file_id: str, headers: dict):
    return client.post("/v1/batches", json={"input_file_id": file_id,
                                            "endpoint": "/v1/completions",
                                            "completion_window": "24h"}, headers=headers)


def test_a_batch_past_the_keys_open_batches_is_429_naming_the_quota_and_count(client):
    f = upload(client, jsonl(line("a")), A).json()
    made = [_create(client, f["id"], A) for _ in range(2)]
    assert [r.status_code for r in made] == [200, 200]
    refused = _create(client, f["id"], A)
    assert refused.status_code == 429, refused.text
    err = refused.json()["error"]
    assert err["code"] == "quota_exceeded"
    assert "quota of 2 open batches" in err["message"] and "has 2 batches" in err["message"]
    assert int(refused.headers["Retry-After"]) >= 1
    # Key B has the default quota.
    fb = upload(client, jsonl(line("b")), B).json()
    assert _create(client, fb["id"], B).status_code == 200
    # Still open once the driver has validated them (and read their input: not mid-read when
    # the app stops).
    deadline = time.monotonic() + 15
    for r in made:
        while client.get(f"/v1/batches/{r.json()['id']}", headers=A).json()[
                "status"] != "in_progress":
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert _create(client, f["id"], A).status_code == 429


def test_an_upload_past_the_keys_stored_bytes_is_413_naming_the_quota_and_bytes(client):
    first = jsonl(*(line(f"c{i}") for i in range(5)))
    assert 500 < len(first) <= 1000
    kept = upload(client, first, A)
    assert kept.status_code == 200, kept.text
    refused = upload(client, first, A)
    assert refused.status_code == 413, refused.text
    err = refused.json()["error"]
    assert err["code"] == "storage_quota_exceeded"
    assert "quota of 1000 bytes" in err["message"]
    assert f"hold {len(first)} bytes" in err["message"]
    assert f"adds {len(first)}" in err["message"]
    assert upload(client, first, B).status_code == 200  # B's files are B's own
    # Deleting a file gives its bytes back.
    assert client.delete(f"/v1/files/{kept.json()['id']}", headers=A).status_code == 200
    assert upload(client, first, A).status_code == 200


async def test_open_batches_created_at_once_take_no_more_than_the_quota(aredis, tmp_path):
    s = Settings(max_active_batches_per_key=3)
    quotas = Quotas(aredis, s)
    batches = BatchStore(aredis, s.file_ttl_seconds)

    async def create() -> bool:
        try:
            async with quotas.new_batch("k1"):
                await asyncio.sleep(0.01)  # a slow create: the others are waiting on the lock
                await batches.create("file-x", "/v1/completions", "24h", None, "k1")
        except QuotaExceeded:
            return False
        return True

    made = await asyncio.gather(*(create() for _ in range(10)))
    assert sum(made) == 3
    assert await quotas.open_batches("k1") == 3 and await quotas.open_batches("k2") == 0


@pytest.fixture
def no_prune_pause(monkeypatch):
    monkeypatch.setattr(quotas_module, "PRUNE_SECONDS", 0.0)


async def test_a_keys_batch_lines_take_at_most_its_share_of_the_models_queue(
        aredis, store, settings, dispatcher, no_prune_pause):
    s = settings.model_copy(update={"max_queue_depth": 20, "batch_queue_share_per_key": 0.25})
    subs = Submissions(aredis, store, load_registry(s.model_registry), dispatcher, s)
    results = await asyncio.gather(
        *(subs.submit(_line(i), Principal("k1"), None, batch=True) for i in range(8)),
        return_exceptions=True)
    accepted = [r for r in results if isinstance(r, Submitted)]
    refused = [r for r in results if isinstance(r, QuotaExceeded)]
    assert len(accepted) == 5 and len(refused) == 3, results
    assert "quota of 5 queued or running batch sub-requests" in str(refused[0])
    assert "on model tiny-gpt2" in str(refused[0]) and "this key has 5" in str(refused[0])
    # Queued in the batch step, and not counted as the interactive backlog.
    assert await batch_depth(aredis, "tiny-gpt2") == 5
    assert await queue_depth(aredis, "tiny-gpt2") == 0
    assert all(r.job.meta.priority == BATCH_PRIORITY for r in accepted)
    # Another key has a share of its own.
    await subs.submit(_line(0), Principal("k2"), None, batch=True)
    # A line's job ending gives its room back.
    await store.finalize(accepted[0].job.id, JobStatus.SUCCEEDED, [TEXT])
    await subs.submit(_line(8), Principal("k1"), None, batch=True)
    with pytest.raises(QuotaExceeded):
        await subs.submit(_line(9), Principal("k1"), None, batch=True)
    assert await subs.quotas.batch_work("k1", "tiny-gpt2") == 5


async def test_a_reservation_whose_job_was_never_stored_is_given_back_after_its_grace(
        aredis, store, settings, dispatcher, no_prune_pause, monkeypatch):
    s = settings.model_copy(update={"max_queue_depth": 4, "batch_queue_share_per_key": 0.5})
    quotas = Quotas(aredis, s)
    spec = load_registry(s.model_registry).get("tiny-gpt2")
    await quotas.reserve_batch_work("k1", spec, "never-stored", 2)  # its submission died
    with pytest.raises(QuotaExceeded):
        await quotas.reserve_batch_work("k1", spec, "next", 1)
    monkeypatch.setattr(quotas_module, "UNSTORED_GRACE_MS", 0)
    await asyncio.sleep(0.002)
    await quotas.reserve_batch_work("k1", spec, "next", 1)
    assert await quotas.batch_work("k1", "tiny-gpt2") == 1


@dataclass
class Env:
    driver: BatchDriver
    files: FileStore
    batches: BatchStore
    submissions: Submissions


@pytest.fixture
async def env(aredis, store, settings, dispatcher, lifecycle, tmp_path, no_prune_pause):
    s = settings.model_copy(update={"max_queue_depth": 40, "batch_queue_share_per_key": 0.25,
                                    "batch_max_in_flight": 300})
    blobs = LocalBlobStore(tmp_path / "blobs")
    registry = load_registry(s.model_registry)
    files = FileStore(aredis, blobs, s.file_ttl_seconds)
    batches = BatchStore(aredis, s.file_ttl_seconds)
    subs = Submissions(aredis, store, registry, dispatcher, s)
    parts = DriverParts(batches, files, blobs, store, subs, lifecycle, registry)
    yield Env(BatchDriver(parts, s, "one", DriverConfig(tick_seconds=0.05)), files, batches,
              subs)
    await blobs.close()


async def test_a_batch_past_its_keys_share_waits_in_progress_and_loses_no_line(env, aredis,
                                                                                 store):
    content = jsonl(*(line(f"c{i}", model="tiny-gpt2", prompt=f"p{i}", max_tokens=2)
                      for i in range(30)))
    f = await env.files.create(content, "in.jsonl", "batch", "k1", 30)
    batch_id = (await env.batches.create(f.id, "/v1/completions", "24h", None, "k1"))["id"]
    await env.driver.tick()  # validates and submits what the share allows
    jobs = await aredis.hgetall(names.batch_jobs_key(batch_id))
    assert len(jobs) == 10  # 0.25 of 40
    assert await aredis.llen(batch_list("tiny-gpt2")) == 10
    # The key's batch holds its share; another key's interactive job is not refused.
    other = await env.submissions.submit(_line(0), Principal("k2"), None)
    assert other.job.meta.priority < BATCH_PRIORITY
    most = 0
    deadline = time.monotonic() + 30
    while (h := await env.batches.find(batch_id))["status"] != "completed":
        assert h["status"] == "in_progress", h
        assert time.monotonic() < deadline, h
        outstanding = await env.submissions.quotas.batch_work("k1", "tiny-gpt2")
        assert outstanding <= 10
        most = max(most, outstanding)
        for job_id in (await aredis.hgetall(names.batch_jobs_key(batch_id))).values():
            rec = await store.get(job_id.decode())
            if not rec.final:
                await store.finalize(rec.id, JobStatus.SUCCEEDED, [TEXT])
        await asyncio.sleep(0.1)
        await env.driver.tick()
    assert most == 10
    assert h["completed"] == "30" and h["failed"] == "0", h
