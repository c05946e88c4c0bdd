"""Idempotency-Key on job creation: the same key with the same body gives the same job; with a
different body, a 409. Keys are scoped to the caller's API key and kept for a day."""

import hashlib
import json

import redis.asyncio as aioredis

from shared import names
from shared.errors import IdempotencyConflict

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
