"""Usage per API key: the counters the scripts keep and how they are read.

Each API key (`_open` on an open API) has a hash per UTC day, by the Redis server's clock,
`fm:usage:{key}:{YYYYMMDD}`, whose fields are `model|metric` counts (fragments/usage.lua). A
sub-result's tokens, images and device time are counted with its first write
(store_result.lua), a job under its final status when it becomes final (finish_job.lua): each
once, whatever was retried or delivered twice. The hashes expire FIBERMILL_USAGE_RETENTION_DAYS
after their last change."""

from collections.abc import Sequence
from datetime import date

import redis.asyncio as aioredis

from shared import redis_replies as replies
from shared.messages import GeneratedImage, GeneratedText, SubResult

OPEN_OWNER = "_open"  # the one tenant of an open API (no keys), as the scripts name it
JOBS_PREFIX = "jobs_"  # a job counted under its final status: jobs_succeeded, jobs_failed...
DAY_SECONDS = 86400


def usage_key(owner: str | None, day: date) -> str:
    """The scripts build the same name (fragments/usage.lua)."""
    return f"fm:usage:{owner or OPEN_OWNER}:{day:%Y%m%d}"


def subresult_usage(result: SubResult) -> str:
    """What a sub-result counts, as store_result.lua takes it: 'prompt_tokens
    completion_tokens images device_ms'. Device time is the worker's, from taking the
    sub-request to its result, in milliseconds (whole numbers keep the sums exact)."""
    prompt = completion = images = 0
    if isinstance(result.output, GeneratedText):
        completion = result.output.tokens
        prompt = result.output.prompt_tokens or 0
    elif isinstance(result.output, GeneratedImage):
        images = 1
    device_ms = 0
    if result.started_at is not None and result.finished_at is not None:
        device_ms = max(0, round((result.finished_at - result.started_at) * 1000))
    return f"{prompt} {completion} {images} {device_ms}"


async def read_days(redis: aioredis.Redis, owner: str | None,
                    days: Sequence[date]) -> dict[date, dict[str, int]]:
    """Each day's counters (`model|metric` -> count) of `owner`, in one round trip; days
    with nothing counted are left out."""
    async with redis.pipeline(transaction=False) as pipe:
        for day in days:
            pipe.hgetall(usage_key(owner, day))
        got = await pipe.execute()
    out = {}
    for day, raw in zip(days, got, strict=True):
        if raw:
            out[day] = {k: int(v) for k, v in replies.text_hash(raw).items()}
    return out
