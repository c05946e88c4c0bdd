"""The per-key token bucket: a burst, then 429 with Retry-After, per key, refilled over time."""

import asyncio

import pytest
from fastapi.testclient import TestClient

from services.api.app import create_app
from services.api.auth import Principal
from services.api.ratelimit import RateLimiter, bucket_key
from shared.errors import RateLimited
from shared.jobstore import NewJob
from shared.queue_depth import queue_depth
from shared.settings import Settings, get_settings
from shared.token_bucket import TokenBucket

TEXT = {"task": "text-generation", "model": "tiny-gpt2", "input": {"prompts": ["hi"]}}


@pytest.fixture
def client(settings_env, monkeypatch):
    # 6 a minute is one token every 10 s: nothing refills during the test.
    monkeypatch.setenv("FIBERMILL_RATE_LIMIT_PER_MINUTE", "6")
    monkeypatch.setenv("FIBERMILL_RATE_LIMIT_BURST", "2")
    monkeypatch.setenv("FIBERMILL_API_KEYS", "key-one,key-two")
    get_settings.cache_clear()
    with TestClient(create_app()) as c:
        yield c


def _post(client, key: str):
    return client.post("/v1/jobs", json=TEXT, headers={"Authorization": f"Bearer {key}"})


async def test_after_the_burst_submissions_get_429_with_retry_after(client, aredis):
    assert [_post(client, "key-one").status_code for _ in range(2)] == [202, 202]
    refused = _post(client, "key-one")
    assert refused.status_code == 429, refused.text
    assert refused.headers["Retry-After"] == "10"
    assert refused.json()["code"] == "rate_limited"
    assert "6 job submissions per minute" in refused.json()["detail"]
    assert await queue_depth(aredis, "tiny-gpt2") == 2  # the refused job was not enqueued
    # Each key has a bucket of its own.
    assert _post(client, "key-two").status_code == 202


def test_reading_jobs_is_not_rate_limited(client):
    job = _post(client, "key-one").json()
    _post(client, "key-one")
    assert _post(client, "key-one").status_code == 429
    got = client.get(f"/v1/jobs/{job['id']}", headers={"Authorization": "Bearer key-one"})
    assert got.status_code == 200


def _create(store, job_id: str, bucket: TokenBucket):
    return store.create(NewJob(job_id, "text-generation", "tiny-gpt2", {"prompts": ["a"]}, 1),
                        bucket=bucket)


async def test_bucket_refills_at_the_rate(store, aredis):
    limiter = RateLimiter(Settings(rate_limit_per_minute=600, rate_limit_burst=2))
    who = limiter.bucket(Principal("abc"))
    await _create(store, "j1", who)
    await _create(store, "j2", who)
    with pytest.raises(RateLimited) as err:
        await _create(store, "j3", who)
    assert err.value.retry_after == 1  # 0.1 s to the next token, rounded up to a whole second
    assert not await aredis.exists("fm:job:j3")  # refused: nothing stored
    await asyncio.sleep(0.15)  # 10 tokens a second: one is back
    await _create(store, "j3", who)
    with pytest.raises(RateLimited):
        await _create(store, "j4", who)
    # The bucket goes away once it would be full again.
    ttl_ms = await aredis.pttl(who.key)
    assert 0 < ttl_ms <= 1300


async def test_retry_after_is_the_time_to_one_token(store):
    limiter = RateLimiter(Settings(rate_limit_per_minute=2, rate_limit_burst=1))
    await _create(store, "j1", limiter.bucket(Principal(None, "10.1.2.3")))
    with pytest.raises(RateLimited) as err:
        await _create(store, "j2", limiter.bucket(Principal(None, "10.1.2.3")))
    assert err.value.retry_after == 30
    # an open API counts per client address
    await _create(store, "j3", limiter.bucket(Principal(None, "10.9.9.9")))


async def test_a_retried_create_takes_no_second_token(store):
    bucket = RateLimiter(Settings(rate_limit_per_minute=2, rate_limit_burst=1)).bucket(
        Principal("abc"))
    first = await _create(store, "j1", bucket)
    # The same id again (a retry after a lost reply): the job as stored, no token taken.
    assert (await _create(store, "j1", bucket)).created_at == first.created_at


def test_invalid_and_replayed_submissions_take_no_token(client):
    bad = {**TEXT, "input": {"prompts": ["hi"], "max_new_tokens": -1}}
    for _ in range(3):
        assert client.post("/v1/jobs", json=bad,
                           headers={"Authorization": "Bearer key-one"}).status_code == 422
    headers = {"Authorization": "Bearer key-one", "Idempotency-Key": "once"}
    assert client.post("/v1/jobs", json=TEXT, headers=headers).status_code == 202
    for _ in range(2):  # replays of the job already made
        assert client.post("/v1/jobs", json=TEXT, headers=headers).status_code == 200
    assert _post(client, "key-one").status_code == 202  # the burst's second token
    assert _post(client, "key-one").status_code == 429


def test_bucket_keys():
    assert bucket_key(Principal("0123abcd")) == "fm:bucket:key:0123abcd"
    assert bucket_key(Principal(None, "10.0.0.7")) == "fm:bucket:ip:10.0.0.7"
    assert bucket_key(Principal(None)) == "fm:bucket:anonymous"
