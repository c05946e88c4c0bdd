"""The installation's secret, which signs the webhooks of an open API (no API keys; with keys,
each key has its own: keyring.py): the configured one, or this installation's own.

A deployment that sets no `FIBERMILL_WEBHOOK_SECRET` must not sign with a value anyone could
read in a repository, so the first API replica that needs it makes a random one and keeps it
in Redis, where every replica finds the same one (`SET NX`). Receivers read it with
`GET /v1/webhook-secret`, or with redis-cli from `fm:webhook_secret` in that Redis: the replica
that makes it logs the command, naming the Redis it uses (never its password).
"""

import base64
import logging
import secrets
import shlex
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import SSLConnection

from shared import names

log = logging.getLogger(__name__)


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def redis_cli(redis: aioredis.Redis) -> str:
    """The redis-cli command line that reaches the Redis `redis` talks to: its socket or host
    and port, database, TLS and user, with `--askpass` in place of a password (a log line
    must not carry it). A bare `redis-cli` would ask the default local port, which a stack
    on a Redis of its own (`make run`) or a remote one does not use."""
    pool = getattr(redis, "connection_pool", None)
    kwargs: dict[str, Any] = getattr(pool, "connection_kwargs", {})
    words = ["redis-cli"]
    if kwargs.get("path"):
        words += ["-s", str(kwargs["path"])]
    elif kwargs.get("host"):
        words += ["-h", str(kwargs["host"]), "-p", str(kwargs.get("port", 6379))]
    if kwargs.get("db"):
        words += ["-n", str(kwargs["db"])]
    if pool is not None and issubclass(getattr(pool, "connection_class", object), SSLConnection):
        words.append("--tls")
    if kwargs.get("username"):
        words += ["--user", str(kwargs["username"])]
    if kwargs.get("password"):
        words.append("--askpass")
    return shlex.join(words)


async def installation_secret(redis: aioredis.Redis) -> str:
    # One command (SET NX GET, Redis 7): the secret kept, or the new one when none was, with
    # no moment between the two where the key may be gone.
    made = new_secret()
    kept = await redis.set(names.WEBHOOK_SECRET, made, nx=True, get=True)
    if kept is None:
        log.warning("no FIBERMILL_WEBHOOK_SECRET set: webhooks are signed with a secret made "
                    "for this installation; read it with `%s GET %s`",
                    redis_cli(redis), names.WEBHOOK_SECRET)
        return made
    return kept.decode() if isinstance(kept, bytes) else str(kept)
