"""The Redis client both services use: one that rides out a short Redis outage.

A Redis that restarts (a crash, a rolling update, a failover) refuses connections, then answers
LOADING while it reads its AOF, for a few seconds; one paused by the kernel or a long fork
answers nothing. Each command is retried with capped exponential backoff for about
`redis_retry_seconds` before its caller sees the error (an API answer 503, a worker message
handed back), so a short outage costs latency, not failed requests. Every script that a retry
could run twice is safe to run twice: creating a job checks its id, a result is written once,
a lease taken twice is `busy` and expires.

The pool blocks when all its connections are in use (for as long as a command may retry)
instead of failing at once: while Redis is paused every command holds its connection, and a
burst of them must wait for one, not fail with "too many connections".
"""

import math

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import BusyLoadingError, ConnectionError, TimeoutError

from shared.settings import Settings

BACKOFF_CAP_SECONDS = 1.0
BACKOFF_BASE_SECONDS = 0.05
MAX_CONNECTIONS = 256  # per process


def connect(settings: Settings, **kwargs) -> aioredis.Redis:
    # The backoff doubles from 50 ms to its 1 s cap in five retries; the rest wait 1 s each.
    retries = 5 + math.ceil(settings.redis_retry_seconds / BACKOFF_CAP_SECONDS)
    pool = aioredis.BlockingConnectionPool.from_url(
        settings.redis_url,
        max_connections=MAX_CONNECTIONS,
        timeout=max(1.0, settings.redis_retry_seconds),
        retry=Retry(ExponentialBackoff(cap=BACKOFF_CAP_SECONDS, base=BACKOFF_BASE_SECONDS),
                    retries),
        retry_on_error=[ConnectionError, TimeoutError, BusyLoadingError],
        **kwargs,
    )
    return aioredis.Redis.from_pool(pool)
