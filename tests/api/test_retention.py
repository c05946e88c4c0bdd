"""Retention on the real app: an image outlives its job's record for the key that made it, and
a record or an output past its retention answers 410 Gone naming the setting; an id this API
never made stays a 404."""

import asyncio
import time
import uuid

import pytest
import redis
import redis.asyncio as aioredis
from fastapi.testclient import TestClient

from services.api.app import create_app
from services.api.auth import digest, key_id
from shared.blobstore.keys import output_key
from shared.blobstore.local import LocalBlobStore
from shared.job import JobMeta
from shared.job_ids import new_job_id
from shared.jobstore import JobStore, NewJob
from shared.messages import GeneratedImage, SubResult
from shared.settings import get_settings

KEY_A = "fm-test-key-alpha"
KEY_B = "fm-test-key-bravo"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
DAY = 86400


def _as(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def client(settings_env, monkeypatch):
    monkeypatch.setenv("FIBERMILL_API_KEYS", f"{KEY_A},{KEY_B}")
    # No sweep during a test: an expired output must be refused before it is swept.
    monkeypatch.setenv("FIBERMILL_SWEEP_INTERVAL_SECONDS", "3600")
    get_settings.cache_clear()
    with TestClient(create_app()) as c:
        yield c


def _put_output(job_id: str, owner_key: str) -> None:
    async def put():
        store = LocalBlobStore(get_settings().blob_dir)
        await store.put(output_key(job_id, 0, key_id(digest(owner_key))), PNG, "image/png")
    asyncio.run(put())


def test_an_image_outlives_its_record_for_the_key_that_made_it_only(client):
    job_id = new_job_id(time.time() - 2 * DAY)  # record gone after 24 h; outputs kept 7 days
    _put_output(job_id, KEY_A)

    mine = client.get(f"/v1/jobs/{job_id}/outputs/0", headers=_as(KEY_A))
    assert mine.status_code == 200, mine.text
    assert mine.content == PNG and mine.headers["content-type"] == "image/png"
    other = client.get(f"/v1/jobs/{job_id}/outputs/0", headers=_as(KEY_B))
    assert other.status_code == 410 and PNG not in other.content
    assert client.get(f"/v1/jobs/{job_id}/outputs/1", headers=_as(KEY_A)).status_code == 410


def test_a_record_past_its_ttl_is_gone_naming_the_setting(client):
    job_id = new_job_id(time.time() - 2 * DAY)
    for path in (f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/events"):
        resp = client.get(path, headers=_as(KEY_A))
        assert resp.status_code == 410, (path, resp.text)
        body = resp.json()
        assert body["code"] == "expired"
        assert "kept for 24 hours" in body["detail"]
        assert "FIBERMILL_FINISHED_JOB_TTL_SECONDS" in body["detail"]
    cancel = client.post(f"/v1/jobs/{job_id}/cancel", headers=_as(KEY_A))
    assert cancel.status_code == 410


@pytest.mark.parametrize("job_id", [uuid.uuid4().hex, new_job_id(time.time() - 60)],
                         ids=["undated", "made-a-minute-ago"])
def test_an_id_never_made_here_is_404(client, job_id):
    for path in (f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/outputs/0"):
        resp = client.get(path, headers=_as(KEY_A))
        assert resp.status_code == 404, (path, resp.text)


def test_an_output_past_its_retention_is_gone_even_before_the_sweep(client):
    job_id = new_job_id(time.time() - 8 * DAY)
    _put_output(job_id, KEY_A)  # not swept yet: still refused
    resp = client.get(f"/v1/jobs/{job_id}/outputs/0", headers=_as(KEY_A))
    assert resp.status_code == 410
    assert resp.json() == {"code": "expired", "detail": (
        f"output 0 of job {job_id} has expired: outputs are kept for 7 days after their job "
        "was made (FIBERMILL_OUTPUT_TTL_SECONDS)")}


def test_an_output_past_its_retention_is_gone_while_its_record_is_kept(client, redis_url):
    """A deployment that keeps records longer than outputs."""
    job_id = new_job_id(time.time() - 8 * DAY)
    _put_output(job_id, KEY_A)

    async def record():
        r = aioredis.Redis.from_url(redis_url)
        store = JobStore(r)
        await store.create(NewJob(job_id, "image-generation", "digits", {"prompts": ["3"]}, 1,
                                  JobMeta(owner=key_id(digest(KEY_A)))))
        await store.store_result(job_id, SubResult(
            index=0, output=GeneratedImage(seed=1, width=16, height=16),
            blob=output_key(job_id, 0, key_id(digest(KEY_A))), worker="w1"), model="digits")
        await r.aclose()
    asyncio.run(record())

    assert client.get(f"/v1/jobs/{job_id}", headers=_as(KEY_A)).status_code == 200
    resp = client.get(f"/v1/jobs/{job_id}/outputs/0", headers=_as(KEY_A))
    assert resp.status_code == 410 and resp.json()["code"] == "expired"


def test_a_jobs_sub_requests_carry_its_owner_so_its_images_are_filed_under_it(client,
                                                                             redis_url):
    import base64
    import json

    from shared.queue_depth import priority_lists

    job = client.post("/v1/jobs", json={"model": "digits", "input": {"prompts": ["3", "8"]}},
                      headers=_as(KEY_A)).json()
    with redis.Redis.from_url(redis_url) as r:
        raw = [m for key in priority_lists("digits") for m in r.lrange(key, 0, -1)]
    subs = [json.loads(base64.b64decode(json.loads(m)["body"]))[0][0] for m in raw]
    assert sorted(s["index"] for s in subs if s["job_id"] == job["id"]) == [0, 1]
    assert {s["owner"] for s in subs if s["job_id"] == job["id"]} == {key_id(digest(KEY_A))}
