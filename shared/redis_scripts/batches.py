"""Wrappers of the batch store's scripts (scripts/batch_*.lua): a batch's status moves, its
lines' progress, and the lease of the replica that drives it."""

from collections.abc import Mapping, Sequence

import redis.asyncio as aioredis

from shared import names
from shared import redis_replies as replies
from shared.redis_scripts.loader import Script

BATCH_TRANSITION = Script("batch_transition")
BATCH_RECORD_LINE = Script("batch_record_line")
BATCH_RECORD_JOB = Script("batch_record_job")
BATCH_RENEW = Script("batch_renew")
BATCH_RELEASE = Script("batch_release")
BATCH_FLUSH = Script("batch_flush")
BATCH_UPGRADE_DONE = Script("batch_upgrade_done")


async def transition(redis: aioredis.Redis, *, batch_id: str, from_: Sequence[str], to: str,
                     stamp: str, fields: Mapping[str, str | int | float]) -> int:
    """Move the batch from one of `from_` to `to`, setting the field `stamp` (unless empty) to
    Redis's time in seconds, and `fields`: 1 moved, 0 its status was another, -1 no batch."""
    items = [x for kv in fields.items() for x in kv]
    return replies.integer(await BATCH_TRANSITION.run(
        redis, [names.batch_key(batch_id)], [",".join(from_), to, stamp, *items]))


async def record_line(redis: aioredis.Redis, *, batch_id: str, me: str, index: int,
                      entry: str, counter: str) -> int:
    """Mark line `index` done and keep its file line (until flush) once, counted in
    `counter`: 1 done now, 0 done already, -1 `me` no longer holds the lease."""
    return replies.integer(await BATCH_RECORD_LINE.run(
        redis,
        [names.batch_key(batch_id), names.batch_jobs_key(batch_id),
         names.batch_done_key(batch_id), names.batch_lease_key(batch_id),
         names.batch_lines_key(batch_id)],
        [me, index, entry, counter]))


async def flush(redis: aioredis.Redis, *, batch_id: str, me: str, part: str,
                indices: Sequence[int]) -> int:
    """The lines `indices` are in the part `part` now: it is named, they are dropped. 1, or -1
    when `me` no longer holds the lease."""
    return replies.integer(await BATCH_FLUSH.run(
        redis,
        [names.batch_lines_key(batch_id), names.batch_parts_key(batch_id),
         names.batch_lease_key(batch_id)],
        [me, part, *indices]))


async def record_job(redis: aioredis.Redis, *, batch_id: str, me: str, index: int,
                     job_id: str) -> int:
    """Line `index` was submitted as `job_id`: 1 recorded, 0 the line is done, -1 `me` no
    longer holds the lease."""
    return replies.integer(await BATCH_RECORD_JOB.run(
        redis,
        [names.batch_jobs_key(batch_id), names.batch_done_key(batch_id),
         names.batch_lease_key(batch_id)],
        [me, index, job_id]))


async def renew(redis: aioredis.Redis, *, batch_id: str, me: str, lease_ms: int) -> bool:
    """True when `me` held the lease (it now runs `lease_ms` more)."""
    return replies.integer(await BATCH_RENEW.run(
        redis, [names.batch_lease_key(batch_id)], [me, lease_ms])) == 1


async def release(redis: aioredis.Redis, *, batch_id: str, me: str) -> bool:
    """True when `me` held the lease (it is given up)."""
    return replies.integer(await BATCH_RELEASE.run(
        redis, [names.batch_lease_key(batch_id)], [me])) == 1


async def upgrade_done(redis: aioredis.Redis, *, batch_id: str) -> int:
    """Turn a `done` hash kept by an older driver into the bitmap and its lines into lines
    waiting for a part; how many lines it moved (0: nothing to do)."""
    return replies.integer(await BATCH_UPGRADE_DONE.run(
        redis, [names.batch_done_key(batch_id), names.batch_lines_key(batch_id)], []))
