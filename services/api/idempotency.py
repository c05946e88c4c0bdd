"""Idempotency-Key on job creation: the same key with the same body gives the same job; with a
different body, a 409. Keys are scoped to the caller's API key and kept for a day.

A claim names its job and says whether the job was stored yet. A second request that finds a
claim whose job is not in the store tells the two cases apart: a stored job that has since
expired frees the key; one still being created (by a request running beside it) is waited for
briefly and returned, else answered 409, so two concurrent requests make one job. Every change
to a claim checks that it is still the one it read
(shared/redis_scripts/scripts/swap_if_equal.lua).

A claim's time, and whether it is abandoned, are read on the Redis server's clock: replicas
whose clocks disagree by more than ABANDONED_SECONDS would otherwise take over each other's
claims in progress, or never free a dead one."""

import asyncio
import contextlib
import hashlib
import json
import time  # monotonic only: the time a claim was made is the Redis server's
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import redis.asyncio as aioredis

from shared import names, redis_replies
from shared.errors import IdempotencyConflict, JobNotFound
from shared.redis_clock import redis_now
from shared.redis_scripts.claims import swap_if_equal

T = TypeVar("T")  # whatever the caller's loader gives for an earlier job

TTL_SECONDS = 24 * 3600
MAX_KEY_LENGTH = 255
# A claim whose job is still not stored after this long lost its creator (it crashed).
ABANDONED_SECONDS = 60.0
# How long a request waits for a job that a concurrent request with its key is creating.
IN_PROGRESS_WAIT_SECONDS = 2.0
IN_PROGRESS_POLL_SECONDS = 0.02


def body_digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _key(owner: str | None, key: str) -> str:
    scoped = hashlib.sha256(f"{owner or ''}\0{key}".encode()).hexdigest()
    return f"{names.PREFIX}:idem:{scoped}"


def _entry(job_id: str, digest: str, stored: bool, at: float) -> str:
    """A claim: its job, the body's digest, whether the job is stored, and when the claim was
    made (the Redis server's time)."""
    return json.dumps({"job": job_id, "digest": digest, "stored": stored, "at": at})


async def claim(redis: aioredis.Redis, owner: str | None, key: str, digest: str,
                entry: str) -> tuple[str, dict] | None:
    """Claim `key` with `entry` (`_entry`, not stored yet): None when it is ours, else the claim
    found (raw and decoded) if the key was used with this same body; IdempotencyConflict for
    another body."""
    if await redis.set(_key(owner, key), entry, nx=True, ex=TTL_SECONDS):
        return None
    raw = redis_replies.optional_text(await redis.get(_key(owner, key)))
    if raw is None:
        return await claim(redis, owner, key, digest, entry)  # freed in between: try again
    if raw == entry:
        # Our own SET ran after all: its reply was lost to a timeout (a paused Redis) and the
        # client's retry found the key taken. An entry names a fresh job id and its time, so
        # no other request can have written the same one.
        return None
    earlier = json.loads(raw)
    if earlier.get("digest") != digest:
        raise IdempotencyConflict(
            "Idempotency-Key was already used with a different request body")
    return raw, earlier


async def _swap(redis: aioredis.Redis, owner: str | None, key: str, expected: str,
                new: str = "") -> bool:
    """Replace the claim (or delete it, `new` empty) only if it is still `expected`."""
    return await swap_if_equal(redis, key=_key(owner, key), expected=expected, new=new)


class Claims:
    """Idempotency-Key claims held around the creation of a job."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis

    @contextlib.asynccontextmanager
    async def hold(
        self,
        owner: str | None,
        key: str | None,
        digest: str,
        job_id: str,
        load: Callable[[str], Awaitable[T]],
    ) -> AsyncIterator[T | None]:
        """Claim `key` for the new job `job_id` while the block creates it.

        Yields None when the block should create the job (or there is no key), and the earlier
        job, as `load(job_id)` returns it, when the key was used with this same body; raises
        IdempotencyConflict when it was used with another. If the block raises after a claim
        of our own, the key is released so that a retry can succeed.
        """
        if key is None:
            yield None
            return
        earlier, ours = await self._claim_or_load(owner, key, digest, job_id, load)
        if earlier is not None:
            yield earlier  # not our claim: nothing to release whatever the block does
            return
        try:
            yield None
        except Exception:
            # Not BaseException: a cancelled request may already have stored its job, and a
            # claim left pointing at a job never stored is freed once it is abandoned.
            await _swap(self.redis, owner, key, ours)
            raise
        await _swap(self.redis, owner, key, ours,
                    _entry(job_id, digest, True, json.loads(ours)["at"]))

    async def _claim_or_load(
        self,
        owner: str | None,
        key: str,
        digest: str,
        job_id: str,
        load: Callable[[str], Awaitable[T]],
    ) -> tuple[T | None, str]:
        """(None, our claim) once the key is ours, else (the earlier job it names, '')."""
        while True:
            ours = _entry(job_id, digest, stored=False, at=await redis_now(self.redis))
            found = await claim(self.redis, owner, key, digest, ours)
            if found is None:
                return None, ours
            raw, earlier = found
            job = await self._earlier_job(earlier, load)
            if job is not None:
                return job, ""
            # Its job expired, or its creator died before storing it: the key is free again.
            # Loop, as another request may claim it between our release and our next claim.
            await _swap(self.redis, owner, key, raw)

    async def _earlier_job(self, earlier: dict, load: Callable[[str], Awaitable[T]]) -> T | None:
        """The job a claim names; None when it is gone for good; waits a little for one that
        a concurrent request is still creating, and answers 409 if it does not appear."""
        deadline = time.monotonic() + IN_PROGRESS_WAIT_SECONDS
        while True:
            try:
                return await load(earlier["job"])
            except JobNotFound:
                if earlier.get("stored", True):
                    return None  # stored, then expired
                if await redis_now(self.redis) - earlier.get("at", 0) > ABANDONED_SECONDS:
                    return None
                if time.monotonic() > deadline:
                    raise IdempotencyConflict(
                        "a request with this Idempotency-Key is still being processed; "
                        "retry shortly") from None
                await asyncio.sleep(IN_PROGRESS_POLL_SECONDS)
