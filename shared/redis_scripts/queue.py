"""Wrapper of the script that reads where a queued job stands (scripts/queue_position.lua)."""

from dataclasses import dataclass

import redis.asyncio as aioredis

from shared import names
from shared import redis_replies as replies
from shared.queue_depth import priority_lists
from shared.redis_scripts.loader import Script
from shared.throughput import BUCKET_SECONDS

QUEUE_POSITION = Script("queue_position")


@dataclass(frozen=True)
class QueueReading:
    rank: int | None  # outstanding sub-requests sent before the job's first; None: not in it
    outstanding: int  # the model's backlog: waiting, prefetched or running
    urgent: int  # waiting in the priority lists more urgent than the job's
    same: int  # waiting in the job's own priority list (its own message among them)
    waiting: int  # waiting in every priority list
    now: float  # the Redis server's time
    finished: list[int]  # the model's finished counts, the current bucket first


async def queue_position(redis: aioredis.Redis, *, model: str, member: str, priority: int,
                         buckets: int) -> QueueReading:
    lists = priority_lists(model)
    own = min(max(priority, 0), len(lists) - 1) + 1
    reply = await QUEUE_POSITION.run(redis, [names.backlog_key(model), *lists],
                                     [member, model, BUCKET_SECONDS, buckets, own])
    if not isinstance(reply, list) or len(reply) < 6:
        raise TypeError(f"expected [rank, size, urgent, same, all, now, counts...], got {reply!r}")
    rank, outstanding, urgent, same, waiting = (replies.integer(n) for n in reply[:5])
    return QueueReading(rank if rank >= 0 else None, outstanding, urgent, same, waiting,
                        float(replies.text(reply[5])), [replies.integer(n) for n in reply[6:]])
