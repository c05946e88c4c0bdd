"""Finding sub-requests that were sent but that nothing holds any more.

A sub-request is outstanding from the moment its job is stored until its result is (the model's
backlog, `fm:backlog:<model>`, scored with the time it was last sent: Fibermill's own record of
what is outstanding). While outstanding it is, at any moment, in one of three places: waiting in
its queue (kombu's list for its model and priority), leased by a worker that runs it, or nowhere:
its message was taken by a worker that died before leasing it (the broker keeps no copy of a
delivered message: shared/celery_config.py's QoS), a Redis crash lost the write that queued it, or
the replica that was to send it again died first. Leases that expire are the janitor's other
sweep; this one finds the third place.

Queues are first in, first out per list. So a sub-request sent before the oldest message still
waiting in its list, that has no lease, is in no queue: it is lost. Per model, one sweep reads
the tail (the oldest message) of each of its priority lists and looks up when that message's
sub-request was sent; only backlog entries older than that, and older than `lost_after`, are
candidates, so the work is bounded by what runs, not by how deep the queue is. A wrong guess
(a message taken a moment ago and not yet leased) only sends a duplicate, which the lease
turns away.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass

from redis.asyncio import Redis

from shared import names
from shared.job import JobMeta
from shared.queue_depth import priority_lists
from shared.sending import message_member

MAX_CANDIDATES = 200


def _scored(raw: Iterable[object]) -> list[tuple[str, float]]:
    """A ZRANGEBYSCORE WITHSCORES reply as (member, score) pairs: redis-py types it as any of
    its range replies."""
    pairs = []
    for pair in raw:
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise TypeError(f"expected a (member, score) pair, got {pair!r}")
        member, score = pair
        if not isinstance(member, bytes) or not isinstance(score, float):
            raise TypeError(f"expected a (member, score) pair, got {pair!r}")
        pairs.append((member.decode(), score))
    return pairs


@dataclass(frozen=True)
class Orphan:
    model: str
    member: str  # job:index
    sent: float  # its backlog score as read: CLAIM_LOST takes it only if nobody sent it since


class OrphanFinder:
    def __init__(self, redis: Redis, lost_after: float) -> None:
        self.redis = redis
        self.lost_after = lost_after

    async def find(self, model: str) -> list[Orphan]:
        backlog = names.backlog_key(model)
        oldest = await self._oldest_waiting(model)
        now = await self._now()
        upper = min(now - self.lost_after, max(oldest))
        if upper == -math.inf:
            return []
        raw = await self.redis.zrangebyscore(backlog, "-inf", f"({upper!r}", start=0,
                                             num=MAX_CANDIDATES, withscores=True)
        pairs = _scored(raw)
        if not pairs:
            return []
        members = [m for m, _ in pairs]
        async with self.redis.pipeline(transaction=False) as pipe:
            for m in members:
                pipe.zscore(names.LEASES, m)
                pipe.hget(names.job_key(names.split_member(m)[0]), "meta")
            got = await pipe.execute()
        out = []
        for (member, sent), lease, meta in zip(pairs, got[::2], got[1::2], strict=True):
            if lease is not None or meta is None:
                continue  # leased (the lease sweep covers it), or the job is gone
            priority = JobMeta.model_validate_json(meta).priority
            if sent < oldest[priority]:
                out.append(Orphan(model, member, sent))
        return out

    async def _oldest_waiting(self, model: str) -> list[float]:
        """Per priority list, when the oldest message waiting in it was sent: +inf for an empty
        list (nothing waits there), -inf when that cannot be told (its sub-request is done, or
        it is not ours: nothing is judged against it until it leaves)."""
        lists = priority_lists(model)
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in lists:
                pipe.lindex(key, -1)
            tails = await pipe.execute()
        tail_members = [message_member(t) if t is not None else None for t in tails]
        known = [m for m in tail_members if m is not None]
        scores = dict(zip(known, await self.redis.zmscore(names.backlog_key(model), known)
                          if known else [], strict=True))
        oldest = []
        for tail, member in zip(tails, tail_members, strict=True):
            score = None if member is None else scores.get(member)
            if tail is None:
                oldest.append(math.inf)
            elif score is None:
                oldest.append(-math.inf)
            else:
                oldest.append(score)
        return oldest

    async def _now(self) -> float:
        seconds, micros = await self.redis.time()
        return seconds + micros / 1_000_000
