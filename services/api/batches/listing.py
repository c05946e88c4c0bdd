"""Pages of a key's files or batches: their ids in a sorted set (every score 0, so the ids, which
sort by time, are listed by lex range), each object in its own hash. An id whose hash expired is
dropped from the set as the listing meets it."""

from collections.abc import Callable
from typing import TypeVar

import redis.asyncio as aioredis

from shared import redis_replies

T = TypeVar("T")
READ_AHEAD = 100  # ids read per round, so that filtered or expired ones cost few round trips


async def page(redis: aioredis.Redis, index: str, key_of: Callable[[str], str],
               parse: Callable[[dict[bytes, bytes]], T | None], limit: int,
               after: str | None = None, desc: bool = True,
               keep: Callable[[T], bool] = lambda _: True) -> tuple[list[T], bool]:
    """Up to `limit` objects after the id `after`, newest first (`desc`) or oldest first, that
    `keep` keeps; and whether there are more. `parse` gives None for an expired hash."""
    found: list[T] = []
    bound = f"({after}" if after else ("+" if desc else "-")
    batch = max(limit + 1, READ_AHEAD)
    while len(found) <= limit:
        if desc:
            got = await redis.zrevrangebylex(index, bound, "-", start=0, num=batch)
        else:
            got = await redis.zrangebylex(index, bound, "+", start=0, num=batch)
        ids = [redis_replies.text(i) for i in got]
        if not ids:
            break
        async with redis.pipeline(transaction=False) as pipe:
            for i in ids:
                pipe.hgetall(key_of(i))
            raws = await pipe.execute()
        gone = []
        for i, raw in zip(ids, raws, strict=True):
            item = parse(raw)
            if item is None:
                gone.append(i)
            elif keep(item):
                found.append(item)
        if gone:
            await redis.zrem(index, *gone)
        bound = f"({ids[-1]}"
        if len(ids) < batch:
            break
    return found[:limit], len(found) > limit

