"""The installation's secret, which signs the webhooks of an open API (no API keys; with keys,
each key has its own: keyring.py): the configured one, or this installation's own.

A deployment that sets no `FIBERMILL_WEBHOOK_SECRET` must not sign with a value anyone could
read in a repository, so the first API replica that needs it makes a random one and keeps it
in Redis, where every replica finds the same one (`SET NX`). Receivers read it with
`GET /v1/webhook-secret`, or `redis-cli GET fm:webhook_secret`.
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
    # One command (SET NX GET, Redis 7): the secret kept, or the new one when none was, with
    # no moment between the two where the key may be gone.
    made = new_secret()
    kept = await redis.set(names.WEBHOOK_SECRET, made, nx=True, get=True)
    if kept is None:
        log.warning("no FIBERMILL_WEBHOOK_SECRET set: webhooks are signed with a secret made "
                    "for this installation; read it with `redis-cli GET %s`",
                    names.WEBHOOK_SECRET)
        return made
    return kept.decode() if isinstance(kept, bytes) else str(kept)
