"""A queued job's place in its model's line, and when it should start (GET /v1/jobs/{id}).

One script call per read (queue_position.lua): the job's first sub-request's rank in the
model's backlog (send order), how many wait in each part of the queue's priority lists, the
Redis server's time and the model's recent finished counts. The estimate is now + ahead /
throughput; with nothing measured there is none, rather than a guess.

Workers take the most urgent list first, which send order does not know: the rank is kept
within what the lists allow. At least every sub-request waiting at a more urgent priority is
ahead; at most those, the ones taken from the lists already (running or prefetched) and the
others of its own list. So a job is not shown behind a flood of less urgent work (a batch's
lines) sent before it. What is left unknown is how many more urgent ones sent after it came in
before the ones of its own list: the rank counts none of them."""

from datetime import UTC, datetime

import redis.asyncio as aioredis

from shared.job import JobStatus, QueueBasis, QueuePosition
from shared.jobstore import JobRecord
from shared.redis_scripts import queue
from shared.throughput import buckets_in, measure


async def queue_position(redis: aioredis.Redis, rec: JobRecord,
                         window_seconds: int) -> QueuePosition | None:
    """None unless the job is queued (and still in the backlog)."""
    if rec.status != JobStatus.QUEUED:
        return None
    got = await queue.queue_position(redis, model=rec.model, member=f"{rec.id}:0",
                                     priority=rec.meta.priority,
                                     buckets=buckets_in(window_seconds))
    if got.rank is None:
        return None
    ahead = within_the_lists(got)
    rate = measure(got.now, got.finished)
    if rate is None:
        return QueuePosition(position=ahead + 1, ahead=ahead)
    return QueuePosition(
        position=ahead + 1, ahead=ahead,
        estimated_start=datetime.fromtimestamp(got.now + ahead / rate.per_second, UTC),
        basis=QueueBasis(finished=rate.finished, seconds=round(rate.seconds, 3),
                         per_second=round(rate.per_second, 4)),
    )


def within_the_lists(got: queue.QueueReading) -> int:
    """The rank (send order) kept between what the priority lists allow (see above)."""
    taken = max(0, got.outstanding - got.waiting)  # running, or prefetched by a worker
    least = got.urgent
    most = got.urgent + taken + max(0, got.same - 1)
    return min(max(got.rank or 0, least), most)
