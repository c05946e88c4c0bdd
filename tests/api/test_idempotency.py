"""The Idempotency-Key claim around job creation, on the tests' real Redis: released when
creating the job fails, claimed anew when its earlier job expired, a 409 for another body."""

import asyncio
import copy
import json
import time

import pytest
import redis
from fastapi.testclient import TestClient
from pydantic import TypeAdapter

from services.api import idempotency
from services.api.app import create_app
from services.api.auth import Principal
from services.api.submission import Submissions
from shared import names
from shared.errors import IdempotencyConflict
from shared.job import JobRequest
from shared.jobstore import JobStore, NewJob
from shared.queue_depth import priority_lists
from shared.redis_clock import redis_now
from shared.registry import load_registry
from shared.settings import get_settings

TEXT = {"task": "text-generation", "model": "tiny-gpt2", "input": {"prompts": ["a", "b"]}}
OWNER = "key-a"
DIGEST = idempotency.body_digest(TEXT)


class Boom(Exception):
    pass


@pytest.fixture
def claims(aredis) -> idempotency.Claims:
    return idempotency.Claims(aredis)


async def _entry(aredis, key: str) -> dict | None:
    """The claim's job and digest (and whether its job was stored), without its time."""
    raw = await aredis.get(idempotency._key(OWNER, key))
    return {k: v for k, v in json.loads(raw).items() if k != "at"} if raw else None


async def _stored(store: JobStore, job_id: str) -> str:
    await store.create(NewJob(job_id, "text-generation", "tiny-gpt2", {"prompts": ["a"]}, 1))
    return job_id


# The context manager -------------------------------------------------------------------------


async def test_without_a_key_nothing_is_claimed(claims, aredis, store):
    async with claims.hold(OWNER, None, DIGEST, "j1", store.get) as earlier:
        assert earlier is None
    assert await aredis.dbsize() == 0


async def test_a_key_is_released_when_the_block_raises(claims, aredis, store):
    with pytest.raises(Boom):
        async with claims.hold(OWNER, "k", DIGEST, "j1", store.get) as earlier:
            assert earlier is None
            assert (await _entry(aredis, "k"))["job"] == "j1"
            raise Boom
    assert await _entry(aredis, "k") is None
    async with claims.hold(OWNER, "k", DIGEST, "j2", store.get) as earlier:
        assert earlier is None  # the retry claims the key for its own job
    assert await _entry(aredis, "k") == {"job": "j2", "digest": DIGEST, "stored": True}


async def test_a_replay_whose_block_raises_keeps_the_earlier_claim(claims, aredis, store):
    async with claims.hold(OWNER, "k", DIGEST, await _stored(store, "j1"), store.get):
        pass
    with pytest.raises(Boom):
        async with claims.hold(OWNER, "k", DIGEST, "j2", store.get) as earlier:
            assert earlier.id == "j1"
            raise Boom
    assert (await _entry(aredis, "k"))["job"] == "j1"  # not ours to release


async def test_a_key_whose_earlier_job_expired_is_claimed_anew(claims, aredis, store):
    async with claims.hold(OWNER, "k", DIGEST, "expired", store.get):
        pass  # the key names a job that is not (or no longer) in the store
    async with claims.hold(OWNER, "k", DIGEST, "j2", store.get) as earlier:
        assert earlier is None
    assert await _entry(aredis, "k") == {"job": "j2", "digest": DIGEST, "stored": True}


async def test_concurrent_requests_with_one_key_make_one_job(claims, aredis, store):
    """Each pair enters together; the first to claim takes a while to store its job. The
    second waits for it and replays it, instead of taking the key and making a second job."""
    created: list[str] = []

    async def request(key: str, job_id: str, delay: float):
        async with claims.hold(OWNER, key, DIGEST, job_id, store.get) as earlier:
            if earlier is not None:
                return earlier.id
            await asyncio.sleep(delay)  # validating, splitting, storing
            created.append(await _stored(store, job_id))
            return job_id

    pairs = await asyncio.gather(*(
        asyncio.gather(request(f"k{i}", f"a{i}", 0.05), request(f"k{i}", f"b{i}", 0.05))
        for i in range(25)))
    assert len(created) == 25
    assert all(a == b for a, b in pairs)  # both requests of a pair answer with one job


async def test_a_claim_still_in_progress_is_a_409_after_a_short_wait(claims, aredis, store,
                                                                     monkeypatch):
    monkeypatch.setattr(idempotency, "IN_PROGRESS_WAIT_SECONDS", 0.1)
    async with claims.hold(OWNER, "k", DIGEST, "slow", store.get):
        with pytest.raises(IdempotencyConflict, match="still being processed"):
            async with claims.hold(OWNER, "k", DIGEST, "other", store.get):
                pytest.fail("the block must not run")
        await _stored(store, "slow")
    assert await _entry(aredis, "k") == {"job": "slow", "digest": DIGEST, "stored": True}


async def test_a_claim_set_by_our_own_lost_command_is_ours(claims, aredis, store):
    """A SET whose reply timed out ran anyway; its retry finds our entry and must not wait
    for a job that this very request has not created yet."""
    at = await redis_now(aredis)
    ours = idempotency._entry("j1", DIGEST, stored=False, at=at)
    await aredis.set(idempotency._key(OWNER, "k"), ours)
    assert await idempotency.claim(aredis, OWNER, "k", DIGEST, ours) is None
    other = idempotency._entry("j2", DIGEST, stored=False, at=at)
    assert await idempotency.claim(aredis, OWNER, "k", DIGEST, other) is not None


async def test_an_abandoned_claim_is_taken_over(claims, aredis, store):
    stale = idempotency._entry("never-stored", DIGEST, stored=False,
                               at=await redis_now(aredis) - idempotency.ABANDONED_SECONDS - 1)
    await aredis.set(idempotency._key(OWNER, "k"), stale)
    async with claims.hold(OWNER, "k", DIGEST, "j2", store.get) as earlier:
        assert earlier is None
        await _stored(store, "j2")
    assert (await _entry(aredis, "k"))["job"] == "j2"


async def test_a_claim_is_stamped_with_the_redis_servers_time(claims, aredis, store,
                                                              monkeypatch):
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)  # this API host runs an hour fast
    async with claims.hold(OWNER, "k", DIGEST, "j1", store.get):
        stamped = json.loads(await aredis.get(idempotency._key(OWNER, "k")))["at"]
        assert abs(stamped - await redis_now(aredis)) < 60


async def test_a_fast_host_clock_does_not_take_over_a_claim_in_progress(claims, aredis, store,
                                                                        monkeypatch):
    """Another replica claimed the key a moment ago and is still storing its job: a replica an
    hour ahead must not see that claim as abandoned and make a second job."""
    monkeypatch.setattr(idempotency, "IN_PROGRESS_WAIT_SECONDS", 0.1)
    fresh = idempotency._entry("in-progress", DIGEST, stored=False, at=await redis_now(aredis))
    await aredis.set(idempotency._key(OWNER, "k"), fresh)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)
    with pytest.raises(IdempotencyConflict, match="still being processed"):
        async with claims.hold(OWNER, "k", DIGEST, "second", store.get):
            pytest.fail("the block must not run")
    assert await aredis.get(idempotency._key(OWNER, "k")) == fresh.encode()


async def test_a_slow_host_clock_still_frees_an_abandoned_claim(claims, aredis, store,
                                                                monkeypatch):
    """A claim whose creator died two minutes ago (by Redis's clock) is taken over by a
    replica an hour behind, rather than refused for the rest of the key's day."""
    monkeypatch.setattr(idempotency, "IN_PROGRESS_WAIT_SECONDS", 0.1)
    stale = idempotency._entry("never-stored", DIGEST, stored=False,
                               at=await redis_now(aredis) - 120)
    await aredis.set(idempotency._key(OWNER, "k"), stale)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 3600)
    async with claims.hold(OWNER, "k", DIGEST, "j2", store.get) as earlier:
        assert earlier is None
        await _stored(store, "j2")
    assert (await _entry(aredis, "k"))["job"] == "j2"


async def test_another_body_is_a_conflict_and_keeps_the_first_claim(claims, aredis, store):
    async with claims.hold(OWNER, "k", DIGEST, await _stored(store, "j1"), store.get):
        pass
    with pytest.raises(IdempotencyConflict, match="different request body"):
        async with claims.hold(OWNER, "k", "another digest", "j2", store.get):
            pytest.fail("the block must not run")
    assert await _entry(aredis, "k") == {"job": "j1", "digest": DIGEST, "stored": True}


async def test_keys_are_scoped_to_their_owner(claims, store):
    async with claims.hold("key-a", "k", DIGEST, await _stored(store, "j1"), store.get):
        pass
    async with claims.hold("key-b", "k", "another digest", "j2", store.get) as earlier:
        assert earlier is None


# The service ---------------------------------------------------------------------------------


class FlakyStore(JobStore):
    """A store whose first create fails, as a Redis that drops the connection would."""

    failed = False

    async def create(self, *args, **kwargs):
        if not self.failed:
            self.failed = True
            raise ConnectionError("connection reset")
        return await super().create(*args, **kwargs)


def _service(aredis, store, dispatcher, settings) -> Submissions:
    return Submissions(aredis, store, load_registry(settings.model_registry), dispatcher, settings)


def _req(body: dict = TEXT):
    return TypeAdapter(JobRequest).validate_python(copy.deepcopy(body))  # submit sets its seed


async def test_a_retry_after_a_failed_store_creates_the_job(aredis, dispatcher, settings):
    service = _service(aredis, FlakyStore(aredis), dispatcher, settings)
    with pytest.raises(ConnectionError):
        await service.submit(_req(), Principal(OWNER), "k")
    assert await _entry(aredis, "k") is None  # freed at once, not left to the expiry path
    created = await service.submit(_req(), Principal(OWNER), "k")
    replay = await service.submit(_req(), Principal(OWNER), "k")
    assert created.created and not replay.created
    assert replay.job.id == created.job.id


async def test_an_expired_job_is_replaced_and_its_replacement_replayed(
    aredis, store, dispatcher, settings
):
    service = _service(aredis, store, dispatcher, settings)
    first = await service.submit(_req(), Principal(OWNER), "k")
    await aredis.delete(names.job_key(first.job.id))  # expired before its key did
    second = await service.submit(_req(), Principal(OWNER), "k")
    assert second.created and second.job.id != first.job.id
    # The new claim holds the digest of the body as sent, not of the body with its seed.
    replay = await service.submit(_req(), Principal(OWNER), "k")
    assert not replay.created and replay.job.id == second.job.id


# Over HTTP -----------------------------------------------------------------------------------


def test_a_503_frees_the_key_for_a_retry(settings_env, monkeypatch, redis_url):
    monkeypatch.setenv("FIBERMILL_MAX_QUEUE_DEPTH", "2")
    get_settings.cache_clear()
    with TestClient(create_app()) as client:
        assert client.post("/v1/jobs", json=TEXT).status_code == 202  # the queue is now full
        refused = client.post("/v1/jobs", json=TEXT, headers={"Idempotency-Key": "retry"})
        assert refused.status_code == 503
        with redis.Redis.from_url(redis_url) as r:
            assert not r.exists(idempotency._key(None, "retry"))
            r.delete(*priority_lists("tiny-gpt2"))  # drained
        retried = client.post("/v1/jobs", json=TEXT, headers={"Idempotency-Key": "retry"})
        assert retried.status_code == 202
        again = client.post("/v1/jobs", json=TEXT, headers={"Idempotency-Key": "retry"})
        assert again.status_code == 200 and again.json()["id"] == retried.json()["id"]
