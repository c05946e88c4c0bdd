"""Which secrets sign a webhook: those of the API key that owns the job (or the batch).

With API keys, each key has secrets of its own, so a webhook one key's callers can make (or
forge: they know their own secret) never verifies at another key's receiver. A key's first
secret is made on first use (its first webhook, or its first `GET /v1/webhook-secret`); a
rotation makes a new one, and the one it replaces goes on signing beside it for
`webhook_secret_overlap_seconds`, so deliveries in flight and receivers not yet switched keep
verifying. They live in Redis (one zset per key, shared/redis_scripts/scripts/webhook_secret*.lua),
timed by Redis's clock, so every replica signs with the same ones.

An open API (no keys) has one caller, and its webhooks are signed as before with the
installation's secret (services/api/webhooks/secret.py); so is a job stored without an owner.
"""

from dataclasses import dataclass

import redis.asyncio as aioredis

from services.api.webhooks.secret import installation_secret, new_secret
from services.api.webhooks.signing import Signer
from shared import names
from shared.errors import WebhookSecretNotRotatable
from shared.redis_scripts import webhooks as scripts
from shared.settings import Settings

# Rotated-out secrets kept at once: each signs every delivery, so rotating in a loop must not
# grow the signature header (or the zset) without end.
MAX_RETIRED = 4


@dataclass(frozen=True)
class LiveSecret:
    secret: str
    signs_until: float | None  # seconds since the epoch; None for the current secret


class Keyring:
    def __init__(self, redis: aioredis.Redis, settings: Settings) -> None:
        self.redis = redis
        self.overlap_seconds = settings.webhook_secret_overlap_seconds
        # A bad configured secret fails at startup; none configured: the installation's own,
        # read from Redis when first needed.
        self._installation = settings.webhook_secret
        if self._installation:
            Signer(self._installation)

    async def installation(self) -> str:
        if self._installation is None:
            self._installation = await installation_secret(self.redis)
        return self._installation

    async def secrets(self, owner: str | None) -> list[LiveSecret]:
        """The secrets signing `owner`'s webhooks now: the current one first."""
        if owner is None:
            return [LiveSecret(await self.installation(), None)]
        return _live(await scripts.secrets(self.redis, key=names.webhook_secrets_key(owner),
                                           new=new_secret()))

    async def rotate(self, owner: str | None) -> list[LiveSecret]:
        """A new current secret for `owner`; the one it replaces signs for the overlap more."""
        if owner is None:
            raise WebhookSecretNotRotatable(
                "this API has no keys: its webhooks are signed with the installation's secret; "
                "change FIBERMILL_WEBHOOK_SECRET (or, when it is unset, the generated one in "
                f"Redis under {names.WEBHOOK_SECRET}) to replace it")
        return _live(await scripts.rotate(
            self.redis, key=names.webhook_secrets_key(owner), new=new_secret(),
            overlap_seconds=self.overlap_seconds, keep_retired=MAX_RETIRED))

    async def signer(self, owner: str | None) -> Signer:
        return Signer(*(live.secret for live in await self.secrets(owner)))


def _live(found: list[tuple[str, float]]) -> list[LiveSecret]:
    return [LiveSecret(secret, None if until == float("inf") else until)
            for secret, until in found]
