"""A model's throughput: its sub-requests finished per second over a recent window.

Counted as each result is first written (fragments/count_finished.lua, in store_result.lua), in
buckets of BUCKET_SECONDS by the Redis server's clock, each kept just longer than the window;
read, a window's buckets at a time, by queue_position.lua."""

import math
from dataclasses import dataclass

BUCKET_SECONDS = 5


def finished_key(model: str, bucket: int) -> str:
    """The count of `model`'s sub-requests finished in bucket number `bucket` (time //
    BUCKET_SECONDS); the scripts build the same name."""
    return f"fm:finished:{model}:{bucket}"


def bucket_ttl(window_seconds: int) -> int:
    """How long a bucket is kept: the window, and the bucket still filling."""
    return window_seconds + BUCKET_SECONDS


def buckets_in(window_seconds: int) -> int:
    return max(1, math.ceil(window_seconds / BUCKET_SECONDS))


@dataclass(frozen=True)
class Throughput:
    finished: int  # sub-requests finished in the window
    seconds: float  # the time they finished in
    per_second: float


def measure(now: float, counts: list[int]) -> Throughput | None:
    """The throughput from `counts`, the finished counts of the bucket `now` is in and of
    those before it, newest first; None when nothing finished in them (no measure, no guess).

    The time counted starts at the oldest bucket that saw work, not at the window's start: a
    model that was idle before it began working is not taken for a slow one. It is at least a
    bucket long, so that the first results, a moment apart, do not make a huge rate."""
    total = sum(counts)
    if total <= 0:
        return None
    oldest = max(i for i, n in enumerate(counts) if n)
    start = (math.floor(now / BUCKET_SECONDS) - oldest) * BUCKET_SECONDS
    seconds = max(now - start, float(BUCKET_SECONDS))
    return Throughput(total, seconds, total / seconds)
