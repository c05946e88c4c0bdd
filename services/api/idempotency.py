"""Idempotency-Key on job creation: the same key with the same body gives the same job; with a
different body, a 409. Keys are scoped to the caller's API key and kept for a day."""

import contextlib
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import redis.asyncio as aioredis

from shared import names
from shared.errors import IdempotencyConflict, JobNotFound

T = TypeVar("T")  # whatever the caller's loader gives for an earlier job

TTL_SECONDS = 24 * 3600
MAX_KEY_LENGTH = 255


def body_digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _key(owner: str | None, key: str) -> str:
    scoped = hashlib.sha256(f"{owner or ''}\0{key}".encode()).hexdigest()
    return f"{names.PREFIX}:idem:{scoped}"


async def claim(redis: aioredis.Redis, owner: str | None, key: str, digest: str,
                job_id: str) -> str | None:
    """Claim `key` for a new job `job_id`; returns the earlier job's id if the key was used
    with this same body, raises IdempotencyConflict if it was used with another."""
    entry = json.dumps({"job": job_id, "digest": digest})
    if await redis.set(_key(owner, key), entry, nx=True, ex=TTL_SECONDS):
        return None
    earlier = json.loads(await redis.get(_key(owner, key)) or "{}")
    if earlier.get("digest") != digest:
        raise IdempotencyConflict(
            "Idempotency-Key was already used with a different request body")
    return earlier["job"]


async def release(redis: aioredis.Redis, owner: str | None, key: str) -> None:
    """Forget a claim whose job could not be created, so a retry can succeed."""
    await redis.delete(_key(owner, key))


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
        earlier = await self._claim_or_load(owner, key, digest, job_id, load)
        if earlier is not None:
            yield earlier  # not our claim: nothing to release whatever the block does
            return
        try:
            yield None
        except Exception:
            # Not BaseException: a cancelled request may already have stored its job, and a
            # key left pointing at a job that never existed is freed by the next attempt anyway.
            await release(self.redis, owner, key)
            raise

    async def _claim_or_load(
        self,
        owner: str | None,
        key: str,
        digest: str,
        job_id: str,
        load: Callable[[str], Awaitable[T]],
    ) -> T | None:
        """None once the key is ours, else the earlier job it names."""
        while True:
            earlier = await claim(self.redis, owner, key, digest, job_id)
            if earlier is None:
                return None
            try:
                return await load(earlier)
            except JobNotFound:
                # The earlier job expired before its key did: the key is free again. Loop, as
                # another request may claim it between our release and our next claim.
                await release(self.redis, owner, key)
