"""The secret that signs webhooks: the configured one, or this installation's own.

A deployment that sets no `FIBERMILL_WEBHOOK_SECRET` must not sign with a value anyone could
read in a repository, so the first API replica to start makes a random one and keeps it in
Redis, where every replica finds the same one (`SET NX`). Receivers read it there:
`redis-cli GET fm:webhook_secret`.
"""

import base64
import logging
import secrets

import redis.asyncio as aioredis

from shared import names

log = logging.getLogger(__name__)


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


async def installation_secret(redis: aioredis.Redis) -> str:
    if await redis.set(names.WEBHOOK_SECRET, new_secret(), nx=True):
        log.warning("no FIBERMILL_WEBHOOK_SECRET set: webhooks are signed with a secret made "
                    "for this installation; read it with `redis-cli GET %s`",
                    names.WEBHOOK_SECRET)
    return (await redis.get(names.WEBHOOK_SECRET)).decode()
