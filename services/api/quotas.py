"""Per-key quotas: how much of what every key shares one API key may hold at once.

- Open batches (validating, in progress, finalizing or cancelling): a new batch past
  `max_active_batches` is refused with 429 (QuotaExceeded), naming the quota and the count.
- Stored file bytes (uploads and batch output files): an upload that would pass
  `max_stored_file_bytes` is refused with 413 (StorageQuotaExceeded), naming the quota and the
  bytes. Batch output files are never refused: a batch that ran is always written.
- Batch work on a model: one key's batch lines queued or running hold at most
  `batch_queue_share` of the model's queue limit (max_queue_depth), in sub-requests. A line
  past it is put off with QuotaExceeded, which the batch driver treats as a full queue: it
  waits and tries again, and the batch stays in progress.

Each is `FIBERMILL_*_PER_KEY` unless FIBERMILL_KEY_QUOTAS names the key (shared/settings.py).

The first two are counted and acted on under a per-key lock (SET NX PX), so two requests of
one key at once cannot both take the last slot. Batch work is reserved by a script in the step
that counts it (shared/redis_scripts/quotas.py), with the line's job id, before the job is
stored; it is given back when the submission fails, and once the line's job is final. Nothing
is told when a job ends (the workers know nothing of quotas), so when a key's share is found
full its reservations whose jobs are final, or gone, are pruned first: a full share costs one
pipelined read of the key's outstanding jobs, at most once per PRUNE_SECONDS per key and model
in each replica.
"""

import asyncio
import contextlib
import math
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, cast

import redis.asyncio as aioredis
from fastapi import Depends, Request

from services.api.batches.store import FINAL as BATCH_FINAL
from shared import names, redis_replies
from shared.errors import QuotaExceeded, ServiceUnavailable, StorageQuotaExceeded
from shared.job import JobStatus
from shared.redis_scripts import quotas as scripts
from shared.registry import ModelSpec
from shared.settings import Settings

RETRY_AFTER_SECONDS = 1  # the driver's wait before it tries a line put off again
BATCHES_RETRY_AFTER_SECONDS = 60
PRUNE_SECONDS = 0.5
# A reservation whose job is not stored yet is its submission's, still under way: kept this
# long before a prune takes it for one that never stored its job.
UNSTORED_GRACE_MS = 30_000
KEEP_SECONDS = 7 * 24 * 3600  # a key's batch work keys outlive its last reservation this long
LOCK_MS = 10_000  # a lock whose holder died lapses after this
LOCK_WAIT_SECONDS = 5.0
LOCK_POLL_SECONDS = 0.01


@dataclass(frozen=True)
class Limits:
    max_active_batches: int
    max_stored_file_bytes: int
    batch_queue_share: float


def limits(settings: Settings, owner: str | None) -> Limits:
    """The key's quotas: its FIBERMILL_KEY_QUOTAS entry where it has one, else the defaults."""
    own = settings.key_quotas.get(owner or "")
    return Limits(
        own.max_active_batches if own and own.max_active_batches
        else settings.max_active_batches_per_key,
        own.max_stored_file_bytes if own and own.max_stored_file_bytes
        else settings.max_stored_file_bytes_per_key,
        own.batch_queue_share if own and own.batch_queue_share
        else settings.batch_queue_share_per_key,
    )


def batch_work_limit(spec: ModelSpec, settings: Settings, owner: str | None) -> int:
    """The sub-requests of batch work one key may have outstanding on the model."""
    depth = spec.max_queue_depth or settings.max_queue_depth
    return max(1, math.floor(depth * limits(settings, owner).batch_queue_share))


class Quotas:
    def __init__(self, redis: aioredis.Redis, settings: Settings) -> None:
        self.redis = redis
        self.settings = settings
        self._pruned: dict[tuple[str | None, str], float] = {}  # (owner, model) -> monotonic

    # Open batches ----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def new_batch(self, owner: str | None) -> AsyncIterator[None]:
        """Create the key's batch inside this block, or QuotaExceeded when it has its quota
        of open batches."""
        limit = limits(self.settings, owner).max_active_batches
        async with self._locked(owner, "batches"):
            count = await self.open_batches(owner)
            if count >= limit:
                raise QuotaExceeded(
                    f"quota of {limit} open batches per API key reached (max_active_batches): "
                    f"this key has {count} batches validating, in progress or finalizing; "
                    "create more once one ends", retry_after=BATCHES_RETRY_AFTER_SECONDS)
            yield

    async def open_batches(self, owner: str | None) -> int:
        ids = [redis_replies.text(i) for i in await self.redis.smembers(names.BATCHES_ACTIVE)]
        async with self.redis.pipeline(transaction=False) as pipe:
            for batch_id in ids:
                pipe.hmget(names.batch_key(batch_id), ["owner", "status"])
            found = await pipe.execute()
        mine = (owner or "").encode()
        return sum(1 for who, status in found
                   if status is not None and who == mine
                   and status.decode() not in BATCH_FINAL)

    # Stored files ----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def upload(self, owner: str | None, size: int) -> AsyncIterator[None]:
        """Store the key's upload of `size` bytes inside this block, or StorageQuotaExceeded
        when its files would hold more than its quota."""
        limit = limits(self.settings, owner).max_stored_file_bytes
        async with self._locked(owner, "files"):
            used = await self.stored_bytes(owner)
            if used + size > limit:
                raise StorageQuotaExceeded(
                    f"quota of {limit} bytes of stored files per API key reached "
                    f"(max_stored_file_bytes): this key's files hold {used} bytes and this "
                    f"upload adds {size}; delete files (DELETE /v1/files/{{id}}) or wait for "
                    "them to expire")
            yield

    async def stored_bytes(self, owner: str | None) -> int:
        ids = await self.redis.zrange(names.files_index_key(owner), 0, -1)
        async with self.redis.pipeline(transaction=False) as pipe:
            for file_id in ids:
                pipe.hget(names.file_key(redis_replies.text(file_id)), "bytes")
            sizes = await pipe.execute()
        return sum(int(b) for b in sizes if b is not None)  # an expired file's hash is gone

    @contextlib.asynccontextmanager
    async def _locked(self, owner: str | None, quota: str) -> AsyncIterator[None]:
        key = names.quota_lock_key(owner, quota)
        token = secrets.token_hex(8)
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        while not await self.redis.set(key, token, nx=True, px=LOCK_MS):
            if time.monotonic() > deadline:
                raise ServiceUnavailable(f"another request of this API key holds its {quota} "
                                         "quota's lock; retry shortly", retry_after=1)
            await asyncio.sleep(LOCK_POLL_SECONDS)
        try:
            yield
        finally:
            await scripts.unlock(self.redis, key=key, token=token)

    # Batch work ------------------------------------------------------------------------------

    async def reserve_batch_work(self, owner: str | None, spec: ModelSpec, job_id: str,
                                 subrequests: int) -> str:
        """Reserve a batch line's sub-requests in the key's share of the model's queue (the
        reservation, to give back with `release_batch_work`), or QuotaExceeded."""
        limit = batch_work_limit(spec, self.settings, owner)
        member = scripts.work_member(job_id, subrequests)
        held = await self._reserve(owner, spec.name, member, subrequests, limit)
        if held >= 0 and await self._prune(owner, spec.name):
            held = await self._reserve(owner, spec.name, member, subrequests, limit)
        if held >= 0:
            raise QuotaExceeded(
                f"quota of {limit} queued or running batch sub-requests per API key on model "
                f"{spec.name} reached ({self._share(owner):g} of its queue limit, "
                f"batch_queue_share): this key has {held}; its batches go on as they end",
                retry_after=RETRY_AFTER_SECONDS)
        return member

    async def release_batch_work(self, owner: str | None, model: str, member: str) -> None:
        await scripts.release(self.redis, owner=owner, model=model, members=[member])

    async def batch_work(self, owner: str | None, model: str) -> int:
        """The sub-requests of the key's batch work reserved on the model."""
        return int(await self.redis.get(names.batch_work_total_key(owner, model)) or 0)

    def _share(self, owner: str | None) -> float:
        return limits(self.settings, owner).batch_queue_share

    async def _reserve(self, owner: str | None, model: str, member: str, subrequests: int,
                       limit: int) -> int:
        return await scripts.reserve(
            self.redis, owner=owner, model=model, member=member, subrequests=subrequests,
            limit=limit, now_ms=int(time.time() * 1000), keep_seconds=KEEP_SECONDS)

    async def _prune(self, owner: str | None, model: str) -> bool:
        """Give back the key's reservations on the model whose jobs are final or gone; False
        when none was (or this replica pruned them a moment ago)."""
        now = time.monotonic()
        if now - self._pruned.get((owner, model), -math.inf) < PRUNE_SECONDS:
            return False
        self._pruned[(owner, model)] = now
        held = cast(list[tuple[bytes, float]], await self.redis.zrange(
            names.batch_work_key(owner, model), 0, -1, withscores=True))
        members = [(redis_replies.text(m), int(at)) for m, at in held]
        async with self.redis.pipeline(transaction=False) as pipe:
            for member, _at in members:
                pipe.hget(names.job_key(member.split(":", 1)[1]), "status")
            statuses = await pipe.execute()
        stale_before = int(time.time() * 1000) - UNSTORED_GRACE_MS
        done = [member for (member, at), status in zip(members, statuses, strict=True)
                if (JobStatus(status.decode()).final if status is not None
                    else at < stale_before)]
        return await scripts.release(self.redis, owner=owner, model=model, members=done) > 0


async def _quotas(request: Request) -> Quotas:
    return request.app.state.submissions.quotas


QuotasDep = Annotated[Quotas, Depends(_quotas)]
