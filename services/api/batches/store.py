"""Batches in Redis: the batch object, its lines' progress, and the lease of the replica that
drives it. Every change a route and the driver could race on is one script
(shared/redis_scripts/scripts/batch_*.lua).

Keys (shared/names.py): `fm:batch:{id}` (hash: the object's fields, plus the owner, the
webhook, the planned output file ids and the keys of the batch's copy of its input and of its
index), `fm:batch:{id}:jobs` (line index -> job id, for lines submitted and not done),
`fm:batch:{id}:done` (a bitmap: bit i set once line i is done), `fm:batch:{id}:lines` (line
index -> "o"/"e" + the output or error file's line, for lines done and not yet written to a
part), `fm:batch:{id}:parts` (the blob keys of the parts written), `fm:batch:{id}:lease` (the
driving replica), `fm:batches:active` (batches to drive) and `fm:batches:{owner}` (an API key's
batches, for listing). Redis holds a running batch's unfinished lines and a bit a line, not
its finished lines' outputs (Redis runs without eviction).

Times (created_at, expires_at, the status stamps) are Redis's (TIME): replicas whose clocks
disagree agree on when a batch expires."""

import json
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aioredis

from services.api.batches import listing
from services.api.batches.bits import Bits
from services.api.batches.errors import BatchNotFound
from shared import names, redis_replies
from shared.job_ids import created_at, new_job_id
from shared.redis_scripts import batches as scripts

BATCH_PREFIX = "batch_"
COMPLETION_WINDOW_SECONDS = {"24h": 24 * 3600}
FINAL = frozenset({"completed", "failed", "expired", "cancelled"})
OPEN_STATUSES = ("validating", "in_progress")  # what cancel moves to cancelling
TIMESTAMPS = ("in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at",
              "expired_at", "cancelling_at", "cancelled_at")

class LeaseLost(Exception):
    """Another replica drives the batch now: this one stops."""


def new_batch_id(now: float | None = None) -> str:
    return f"{BATCH_PREFIX}{new_job_id(now)}"


def is_batch_id(batch_id: str) -> bool:
    rest = batch_id.removeprefix(BATCH_PREFIX)
    return rest != batch_id and created_at(rest) is not None


def _int(v: str | None) -> int | None:
    return int(float(v)) if v else None


class BatchStore:
    def __init__(self, redis: aioredis.Redis, ttl_seconds: int) -> None:
        self.redis = redis
        self.ttl = ttl_seconds  # of a batch object once it ended (file_ttl_seconds)
        # Told when this replica created or cancelled a batch: its driver acts now rather than
        # at its next tick (another replica's driver finds it at its own tick).
        self._watchers: list[Callable[[], None]] = []

    async def create(self, input_file_id: str, endpoint: str, completion_window: str,
                     metadata: dict[str, str] | None, owner: str | None,
                     webhook: str | None = None) -> dict[str, str]:
        now = await self.now()
        batch_id = new_batch_id(now)
        made = int(created_at(batch_id.removeprefix(BATCH_PREFIX)) or now)
        fields = {
            "id": batch_id, "endpoint": endpoint, "input_file_id": input_file_id,
            "completion_window": completion_window, "status": "validating",
            "created_at": str(made),
            "expires_at": str(made + COMPLETION_WINDOW_SECONDS[completion_window]),
            "metadata": json.dumps(metadata) if metadata is not None else "",
            "total": "0", "completed": "0", "failed": "0",
            "owner": owner or "", "webhook": webhook or "",
        }
        index = names.batches_index_key(owner)
        kept = COMPLETION_WINDOW_SECONDS[completion_window] + self.ttl
        cutoff = f"({BATCH_PREFIX}{new_job_id(now - kept)[:12]}"
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(names.batch_key(batch_id), items=[x for kv in fields.items() for x in kv])
            pipe.zadd(index, {batch_id: 0})
            pipe.zremrangebylex(index, "-", cutoff)
            pipe.expire(index, kept)
            pipe.sadd(names.BATCHES_ACTIVE, batch_id)
            await pipe.execute()
        self._changed()
        return fields

    async def now(self) -> float:
        """Redis's clock, in seconds: the one every replica decides a batch's times on."""
        seconds, micros = await self.redis.time()
        return seconds + micros / 1e6

    async def find(self, batch_id: str) -> dict[str, str] | None:
        if not is_batch_id(batch_id):
            return None
        return _fields(redis_replies.raw_hash(await self.redis.hgetall(names.batch_key(batch_id))))

    async def get(self, batch_id: str, owner: str | None) -> dict[str, str]:
        """The caller's batch (the open API, `owner` None, sees every one); BatchNotFound
        when it is missing, expired or another key's."""
        h = await self.find(batch_id)
        if h is None or (owner is not None and h.get("owner") != owner):
            raise BatchNotFound(batch_id)
        return h

    async def page(self, owner: str | None, limit: int, after: str | None
                   ) -> tuple[list[dict[str, str]], bool]:
        """The owner's batches after `after`, newest first, and whether there are more."""
        return await listing.page(self.redis, names.batches_index_key(owner), names.batch_key,
                                  _fields, limit, after)

    async def transition(self, batch_id: str, from_: tuple[str, ...] | str, to: str,
                         **fields: Any) -> bool:
        """Move the batch to `to` if its status is one of `from_`, with its `{to}_at` time
        and `fields`; False when it was in another status."""
        if isinstance(from_, str):
            from_ = (from_,)
        stamp = f"{to}_at" if f"{to}_at" in TIMESTAMPS else ""
        moved = await scripts.transition(self.redis, batch_id=batch_id, from_=from_, to=to,
                                         stamp=stamp, fields=fields)
        return moved == 1

    async def cancel(self, batch_id: str) -> bool:
        moved = await self.transition(batch_id, OPEN_STATUSES, "cancelling")
        self._changed()
        return moved

    def watch(self, callback: Callable[[], None]) -> None:
        """Call `callback()` (it must not block) when this replica creates or cancels a batch."""
        self._watchers.append(callback)

    def _changed(self) -> None:
        for callback in self._watchers:
            callback()

    # Driving ---------------------------------------------------------------------------------

    async def active(self) -> list[str]:
        return sorted(redis_replies.text(i)
                      for i in await self.redis.smembers(names.BATCHES_ACTIVE))

    async def claim(self, batch_id: str, me: str, lease_ms: int) -> bool:
        return bool(await self.redis.set(names.batch_lease_key(batch_id), me, nx=True,
                                         px=lease_ms))

    async def renew(self, batch_id: str, me: str, lease_ms: int) -> bool:
        return await scripts.renew(self.redis, batch_id=batch_id, me=me, lease_ms=lease_ms)

    async def release(self, batch_id: str, me: str) -> None:
        await scripts.release(self.redis, batch_id=batch_id, me=me)

    async def record_job(self, batch_id: str, me: str, index: int, job_id: str) -> None:
        res = await scripts.record_job(self.redis, batch_id=batch_id, me=me, index=index,
                                       job_id=job_id)
        if res == -1:
            raise LeaseLost(batch_id)

    async def record_line(self, batch_id: str, me: str, index: int, ok: bool,
                          line: dict[str, Any]) -> None:
        entry = ("o" if ok else "e") + json.dumps(line, separators=(",", ":"))
        res = await scripts.record_line(self.redis, batch_id=batch_id, me=me, index=index,
                                        entry=entry, counter="completed" if ok else "failed")
        if res == -1:
            raise LeaseLost(batch_id)

    async def progress(self, batch_id: str) -> tuple[dict[int, str], Bits]:
        """Lines submitted and not done (index -> job id), and lines done."""
        # A batch an older driver ran kept its done lines as a hash: made a bitmap first.
        await scripts.upgrade_done(self.redis, batch_id=batch_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(names.batch_jobs_key(batch_id))
            pipe.get(names.batch_done_key(batch_id))
            jobs, done = await pipe.execute()
        return {int(k): v.decode() for k, v in jobs.items()}, Bits(done or b"")

    async def unflushed(self, batch_id: str) -> int:
        """How many finished lines Redis holds, not yet written to a part."""
        return int(await self.redis.hlen(names.batch_lines_key(batch_id)))

    async def finished_lines(self, batch_id: str) -> dict[int, bytes]:
        """The finished lines not yet written to a part: index -> "o"/"e" + the file line."""
        raw = redis_replies.raw_hash(await self.redis.hgetall(names.batch_lines_key(batch_id)))
        return {int(k): v for k, v in raw.items()}

    async def flushed(self, batch_id: str, me: str, part: str, indices: Sequence[int]) -> None:
        """The lines `indices` are written to the part `part`: Redis lets them go."""
        if await scripts.flush(self.redis, batch_id=batch_id, me=me, part=part,
                               indices=indices) == -1:
            raise LeaseLost(batch_id)

    async def parts(self, batch_id: str) -> list[str]:
        """The blob keys of the batch's parts, in the order they were written."""
        return [redis_replies.text(k)
                for k in await self.redis.lrange(names.batch_parts_key(batch_id), 0, -1)]

    async def set_fields(self, batch_id: str, **fields: Any) -> None:
        await self.redis.hset(names.batch_key(batch_id),
                              mapping={k: str(v) for k, v in fields.items()})

    async def set_if_absent(self, batch_id: str, field: str, value: str) -> str:
        """The field's value: `value` if it had none."""
        await self.redis.hsetnx(names.batch_key(batch_id), field, value)
        got = redis_replies.optional_text(await self.redis.hget(names.batch_key(batch_id), field))
        return got if got is not None else value

    async def retire(self, batch_id: str) -> None:
        """An ended batch: drop what only running it needed; keep its object for the TTL."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(names.batch_jobs_key(batch_id), names.batch_done_key(batch_id),
                        names.batch_lines_key(batch_id), names.batch_parts_key(batch_id),
                        names.batch_lease_key(batch_id))
            pipe.expire(names.batch_key(batch_id), self.ttl)
            pipe.srem(names.BATCHES_ACTIVE, batch_id)
            await pipe.execute()

    async def forget(self, batch_id: str) -> None:
        """An active batch whose object is gone: stop driving it."""
        await self.redis.srem(names.BATCHES_ACTIVE, batch_id)


def openai_batch(h: dict[str, str]) -> dict[str, Any]:
    """The batch as OpenAI's Batch object."""
    errors = json.loads(h["errors"]) if h.get("errors") else None
    return {
        "id": h["id"], "object": "batch", "endpoint": h["endpoint"], "errors": errors,
        "input_file_id": h["input_file_id"], "completion_window": h["completion_window"],
        "status": h["status"], "output_file_id": h.get("output_file_id") or None,
        "error_file_id": h.get("error_file_id") or None, "created_at": int(h["created_at"]),
        **{f: _int(h.get(f)) for f in TIMESTAMPS},
        "request_counts": {"total": int(h.get("total") or 0),
                           "completed": int(h.get("completed") or 0),
                           "failed": int(h.get("failed") or 0)},
        "metadata": json.loads(h["metadata"]) if h.get("metadata") else None,
    }


def _fields(raw: dict[bytes, bytes]) -> dict[str, str] | None:
    if not raw or b"id" not in raw:
        return None  # expired
    return {k.decode(): v.decode() for k, v in raw.items()}
