"""The Redis client both services use: one that rides out a short Redis outage, and with
Sentinel follows a failover.

A Redis that restarts (a crash, a rolling update, a failover) refuses connections, then answers
LOADING while it reads its AOF, for a few seconds; one paused by the kernel or a long fork
answers nothing. Each command is retried with capped exponential backoff for about
`redis_retry_seconds` before its caller sees the error (an API answer 503, a worker message
handed back), so a short outage costs latency, not failed requests. Every script that a retry
could run twice is safe to run twice: creating a job checks its id, a result is written once,
a lease taken twice is `busy` and expires.

With `FIBERMILL_REDIS_SENTINELS`, each connection asks the sentinels where the primary is when
it connects; a connection to a primary that died fails and is retried against the one the
sentinels promoted, and one to a primary demoted to a replica (READONLY, or its blocking
commands unblocked) is closed and retried the same way (redis-py's SentinelManagedConnection).
Scripts are sent by SHA and loaded again where the new primary lacks them (redis-py's Script).

The pool blocks when all its connections are in use (for as long as a command may retry)
instead of failing at once: while Redis is paused every command holds its connection, and a
burst of them must wait for one, not fail with "too many connections".
"""

import asyncio
import math
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection
from redis.backoff import ExponentialBackoff
from redis.exceptions import BusyLoadingError, ConnectionError, ResponseError, TimeoutError
from redis.sentinel import Sentinel as SyncSentinel

from shared.settings import Settings

BACKOFF_CAP_SECONDS = 1.0
BACKOFF_BASE_SECONDS = 0.05
MAX_CONNECTIONS = 256  # per process
SENTINEL_TIMEOUT_SECONDS = 1.0  # a sentinel that does not answer in this long is skipped


class FibermillRedis(aioredis.Redis):
    """A client that knows how many replicas the writes that make a job wait for
    (shared/redis_scripts/loader.py runs them with WAIT)."""

    replicas_to_wait: int = 0
    replica_timeout_ms: int = 2000
    replica_patience_seconds: float = 0.0  # WAIT asked again this long while short
    sentinels: Sentinel | None = None  # the sentinels' clients, closed with this one

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        if self.sentinels is not None:
            await self.sentinels.aclose()


class NoReplicasError(ConnectionError):
    """A primary refusing writes with NOREPLICAS (`min-replicas-to-write`: too few replicas
    connected, as while a failover is under way) is an outage like any other: retried."""


class _NoReplicasRetried:
    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)  # type: ignore[misc]
        except ResponseError as exc:
            if str(exc).startswith("NOREPLICAS"):
                raise NoReplicasError(str(exc)) from exc
            raise


class PrimaryConnection(_NoReplicasRetried, aioredis.Connection):
    """A connection to a Redis at a fixed address."""


class PrimarySSLConnection(_NoReplicasRetried, aioredis.SSLConnection):
    """The same over TLS (a `rediss://` URL)."""


class PrimaryUnixConnection(_NoReplicasRetried, aioredis.UnixDomainSocketConnection):
    """The same over a Unix socket (a `unix://` URL)."""


def _primary_class(url: str) -> type[AbstractConnection]:
    # from_url's own choice by scheme is replaced by any connection_class passed to it, so
    # the scheme is read here.
    scheme = urlsplit(url).scheme
    if scheme == "rediss":
        return PrimarySSLConnection
    if scheme == "unix":
        return PrimaryUnixConnection
    return PrimaryConnection


class FollowingConnection(_NoReplicasRetried, SentinelManagedConnection):
    """A connection to the primary that asks the sentinels where it is on every connect.
    redis-py's asks them in `connect()` only: a command sent on a connection that was dropped
    (a pipeline's, after the primary died) reconnects through `connect_check_health` to the
    address it had, and fails there until its retries run out."""

    async def connect_check_health(self, check_health: bool = True,
                                   retry_socket_connect: bool = True) -> None:
        if self.is_connected:
            return
        if not retry_socket_connect:  # from connect_to: the address is the sentinels'
            await super().connect_check_health(check_health, retry_socket_connect)
            return
        await self.retry.call_with_retry(self._connect_retry, lambda error: asyncio.sleep(0))


class BlockingSentinelPool(SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """Sentinel's pool (connections to whichever node is the primary) that waits for a free
    connection as BlockingConnectionPool does."""


def connect(settings: Settings, **kwargs: Any) -> FibermillRedis:
    # The backoff doubles from 50 ms to its 1 s cap in five retries; the rest wait 1 s each.
    retries = 5 + math.ceil(settings.redis_retry_seconds / BACKOFF_CAP_SECONDS)
    options: dict[str, Any] = {
        "max_connections": MAX_CONNECTIONS,
        "timeout": max(1.0, settings.redis_retry_seconds),
        "retry": Retry(ExponentialBackoff(cap=BACKOFF_CAP_SECONDS, base=BACKOFF_BASE_SECONDS),
                       retries),
        "retry_on_error": [ConnectionError, TimeoutError, BusyLoadingError],
        **kwargs,
    }
    if settings.sentinel_addresses:
        sentinel = _sentinel(settings)
        client = sentinel.master_for(
            settings.redis_sentinel_master, redis_class=FibermillRedis,
            connection_pool_class=BlockingSentinelPool, connection_class=FollowingConnection,
            **_node_options(settings.redis_url), **options)
        client.sentinels = sentinel
    else:
        pool = aioredis.BlockingConnectionPool.from_url(
            settings.redis_url, connection_class=_primary_class(settings.redis_url), **options)
        client = FibermillRedis.from_pool(pool)
    client.replicas_to_wait = settings.replicas_to_wait
    client.replica_timeout_ms = settings.redis_replica_timeout_ms
    client.replica_patience_seconds = settings.redis_retry_seconds
    return client


def _sentinel(settings: Settings) -> Sentinel:
    return Sentinel(settings.sentinel_addresses, sentinel_kwargs=_sentinel_options(settings))


def _sentinel_options(settings: Settings) -> dict[str, Any]:
    """How to talk to the sentinels themselves."""
    password = settings.redis_sentinel_password
    return {"password": password.get_secret_value() if password else None,
            "socket_timeout": SENTINEL_TIMEOUT_SECONDS,
            "socket_connect_timeout": SENTINEL_TIMEOUT_SECONDS}


def _node_options(url: str) -> dict[str, Any]:
    """What a Redis URL says besides its address (password, user, database), for the nodes
    the sentinels name."""
    parsed = redis.connection.parse_url(url)
    return {k: v for k, v in parsed.items() if k in ("username", "password", "db")}


def connect_sync(settings: Settings, **kwargs: Any) -> redis.Redis:
    """A blocking client of the same Redis, for a command-line tool (make run's stop)."""
    if settings.sentinel_addresses:
        return _sync_sentinel(settings).master_for(
            settings.redis_sentinel_master, **_node_options(settings.redis_url), **kwargs)
    return redis.Redis.from_url(settings.redis_url, **kwargs)


def primary_address(settings: Settings) -> tuple[str, int]:
    """Where the sentinels say the primary is now (MasterNotFoundError when none knows)."""
    host, port = _sync_sentinel(settings).discover_master(settings.redis_sentinel_master)
    return str(host), int(port)


def _sync_sentinel(settings: Settings) -> SyncSentinel:
    return SyncSentinel(settings.sentinel_addresses, sentinel_kwargs=_sentinel_options(settings))
