"""The joiner: a Redis Streams consumer group on the completion stream.

Any API replica may take any completion; entries left pending by a replica that died are
claimed by another after `joiner_claim_idle_seconds` (XAUTOCLAIM). Handling an entry twice is
harmless: a job becomes final only once.

The stream is trimmed here, not where entries are added: every `TRIM_INTERVAL_SECONDS` up to the
oldest entry some consumer has read but not acknowledged, or, when none is pending, the last one
delivered. A length cap at XADD would drop entries nobody has read yet when the joiners fall
behind, and their jobs would never finish.
"""

import asyncio
import logging
import time

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from services.api.lifecycle import Lifecycle
from shared import names
from shared.asyncio_compat import raise_if_cancelled
from shared.errors import JobNotFound
from shared.messages import CompletionEntry, CompletionKind
from shared.settings import Settings

log = logging.getLogger(__name__)

TRIM_INTERVAL_SECONDS = 10.0
# Jobs joined at once: a text batch's worth; more would only take Redis connections from the
# requests the replica serves.
JOIN_CONCURRENCY = 32


class Joiner:
    def __init__(
        self, redis: aioredis.Redis, lifecycle: Lifecycle, settings: Settings, consumer: str
    ) -> None:
        self.redis = redis
        self.lifecycle = lifecycle
        self.settings = settings
        self.consumer = consumer
        self.handled = 0

    async def ensure_group(self) -> None:
        try:
            # From "0": completions written before the first API started are joined too.
            await self.redis.xgroup_create(
                names.COMPLETIONS_STREAM, names.JOINER_GROUP, id="0", mkstream=True
            )
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def run(self) -> None:
        await self.ensure_group()
        await self._handle_batch(await self._own_pending())
        last_claim = last_trim = 0.0
        acks: list = []  # handled, acknowledged with the next read
        while True:
            raise_if_cancelled()
            try:
                if time.monotonic() - last_claim > self.settings.joiner_claim_idle_seconds / 2:
                    last_claim = time.monotonic()
                    await self.reclaim()
                if time.monotonic() - last_trim > TRIM_INTERVAL_SECONDS:
                    last_trim = time.monotonic()
                    await self.trim()
                entries = await self._read(acks)
                acks = await self._handle_batch(entries, ack=False) if entries else []
            except asyncio.CancelledError:
                raise
            except ResponseError as exc:
                if "NOGROUP" in str(exc):  # Redis lost the group (restart without AOF)
                    await self.ensure_group()
                else:
                    log.exception("joiner read failed")
                    await asyncio.sleep(1)
            except Exception:
                log.exception("joiner loop error")
                await asyncio.sleep(1)

    async def _read(self, acks: list) -> list:
        """New entries, with the acknowledgement of the last batch in the same round trip."""
        if not acks:
            return _entries(await self.redis.xreadgroup(
                names.JOINER_GROUP, self.consumer, {names.COMPLETIONS_STREAM: ">"},
                count=100, block=self.settings.joiner_block_ms,
            ))
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xack(names.COMPLETIONS_STREAM, names.JOINER_GROUP, *acks)
            pipe.xreadgroup(names.JOINER_GROUP, self.consumer, {names.COMPLETIONS_STREAM: ">"},
                            count=100, block=self.settings.joiner_block_ms)
            _acked, resp = await pipe.execute()
        return _entries(resp)

    async def _own_pending(self) -> list:
        return _entries(await self.redis.xreadgroup(
            names.JOINER_GROUP, self.consumer, {names.COMPLETIONS_STREAM: "0"}, count=1000
        ))

    async def reclaim(self) -> int:
        """Take over entries another (dead) consumer read but never acknowledged."""
        min_idle = int(self.settings.joiner_claim_idle_seconds * 1000)
        start, claimed = "0-0", 0
        while True:
            resp = await self.redis.xautoclaim(
                names.COMPLETIONS_STREAM,
                names.JOINER_GROUP,
                self.consumer,
                min_idle_time=min_idle,
                start_id=start,
                count=100,
            )
            start, entries = resp[0], resp[1]
            entries = [e for e in entries if e[1]]  # deleted entries come back empty
            claimed += len(entries)
            await self._handle_batch(entries)
            if start in (b"0-0", "0-0"):
                return claimed

    async def trim(self) -> int:
        """Drop the entries every consumer group is done with; returns how many went.

        Entries are only added at the end, and an entry is pending only after it was delivered,
        so whatever is older than both the oldest pending entry and the last delivered one is
        done with, also when read and acknowledged between these reads and the XTRIM."""
        keep = []
        for group in await self.redis.xinfo_groups(names.COMPLETIONS_STREAM):
            pending = await self.redis.xpending(names.COMPLETIONS_STREAM, group["name"])
            keep.append(pending["min"] if pending["pending"] else group["last-delivered-id"])
        if not keep:
            return 0  # nobody reads it yet: everything in it is unread
        oldest = min(keep, key=_stream_id)
        return await self.redis.xtrim(names.COMPLETIONS_STREAM, minid=oldest,
                                      approximate=False)

    async def _handle_batch(self, entries: list, ack: bool = True) -> list:
        """Handle entries; returns the ids handled, acknowledged here unless `ack` is False
        (then the caller acknowledges them; an entry handled again after a crash before that
        changes nothing).

        A job's entries are handled in stream order, different jobs' concurrently: a burst of
        jobs finishing together (a text batch retiring) waits on Redis side by side, not one
        round trip after another, so the last of them is not answered tens of milliseconds
        after the first. Concurrent handling of one job is already safe (replicas race on
        it; the job becomes final once), so only the order within a job is kept. At most
        JOIN_CONCURRENCY jobs are joined at once."""
        done: list = []
        slots = asyncio.Semaphore(JOIN_CONCURRENCY)

        async def handle_in_order(job_entries: list) -> None:
            async with slots:
                for entry_id, fields in job_entries:
                    try:
                        await self.handle(fields)
                    except JobNotFound:
                        pass  # expired or deleted: nothing left to join
                    except Exception:
                        # Left pending: this replica or another retries it on the next claim.
                        log.exception("joining %s failed", entry_id)
                        continue
                    done.append(entry_id)

        by_job: dict[bytes | None, list] = {}
        for entry_id, fields in entries:
            by_job.setdefault(fields.get(b"job"), []).append((entry_id, fields))
        await asyncio.gather(*(handle_in_order(job_entries) for job_entries in by_job.values()))
        self.handled += len(done)
        if done and ack:
            await self.redis.xack(names.COMPLETIONS_STREAM, names.JOINER_GROUP, *done)
        return done

    async def handle(self, fields: dict[bytes, bytes]) -> None:
        entry = CompletionEntry.from_fields(fields)
        if entry.kind == CompletionKind.STARTED:
            await self.lifecycle.started(entry.job)
        elif entry.kind == CompletionKind.FINAL:
            await self.lifecycle.finalized(entry.job)
        else:
            await self.lifecycle.settle(entry.job)


def _entries(resp: object) -> list:
    """An XREADGROUP reply's entries: its one stream's, none when it timed out (None). redis-py
    types the reply as RESP3's map too, which these clients never get."""
    if resp is None:
        return []
    if not isinstance(resp, list):
        raise TypeError(f"expected XREADGROUP's array reply, got {resp!r}")
    return [e for _stream, entries in resp for e in entries]


def _stream_id(entry_id: bytes | str) -> tuple[int, int]:
    ms, _, seq = (entry_id.decode() if isinstance(entry_id, bytes) else entry_id).partition("-")
    return int(ms), int(seq or 0)
