"""Wrappers of the webhook outbox's scripts (scripts/webhook_*.lua): a delivery is a hash plus
a member of a due-time zset, and its attempt number is the claim token. And of the signing
secrets' (scripts/webhook_secret*.lua): one zset per API key, secret -> when it stops signing."""

from dataclasses import dataclass

import redis.asyncio as aioredis

from shared import redis_replies as replies
from shared.names import webhook_delivery_key
from shared.redis_scripts.loader import Script

WEBHOOK_ENQUEUE = Script("webhook_enqueue")
WEBHOOK_TAKE = Script("webhook_take")
WEBHOOK_SETTLE = Script("webhook_settle")
WEBHOOK_RELEASE = Script("webhook_release")
WEBHOOK_SECRETS = Script("webhook_secrets")
WEBHOOK_SECRET_ROTATE = Script("webhook_secret_rotate")


@dataclass(frozen=True)
class Delivery:
    """A delivery as the scripts name it: its id and the due zset it waits in."""

    id: str
    due: str

    @property
    def keys(self) -> list[str]:
        return [self.due, webhook_delivery_key(self.id)]


@dataclass(frozen=True)
class Taken:
    attempt: int
    job_id: str
    event: str
    first_at: float


async def enqueue(redis: aioredis.Redis, *, delivery: Delivery, job_id: str, event: str,
                  now: float, ttl: int) -> bool:
    """True when added; False when the delivery was recorded already."""
    return replies.integer(await WEBHOOK_ENQUEUE.run(
        redis, delivery.keys, [delivery.id, job_id, event, repr(now), ttl])) == 1


async def take(redis: aioredis.Redis, *, delivery: Delivery, now: float, lease_until: float,
               consumer: str) -> Taken | None:
    """The next attempt, claimed by `consumer` until `lease_until`; None when the delivery is
    not due (another replica took it) or gone."""
    reply = await WEBHOOK_TAKE.run(redis, delivery.keys,
                                   [delivery.id, repr(now), repr(lease_until), consumer])
    if not reply:
        return None
    if not isinstance(reply, list) or len(reply) != 4:
        raise TypeError(f"unexpected webhook_take reply {reply!r}")
    job_id, event, first_at = replies.texts(reply[1:])
    return Taken(replies.integer(reply[0]), job_id, event, float(first_at))


async def settle(redis: aioredis.Redis, *, delivery: Delivery, attempt: int,
                 next_at: float | None, state: str = "") -> bool:
    """Due again at `next_at`, or done (`next_at` None) in `state`; False when the attempt is
    no longer this sender's."""
    return replies.integer(await WEBHOOK_SETTLE.run(
        redis, delivery.keys,
        [delivery.id, attempt, "" if next_at is None else repr(next_at), state])) == 1


async def release(redis: aioredis.Redis, *, delivery: Delivery, attempt: int,
                  now: float) -> bool:
    """Hand an interrupted claim back, due at `now`; False when it is no longer this
    sender's."""
    return replies.integer(await WEBHOOK_RELEASE.run(
        redis, delivery.keys, [delivery.id, attempt, repr(now)])) == 1


def _secrets(reply: object) -> list[tuple[str, float]]:
    flat = replies.texts(reply)
    return [(flat[i], float(flat[i + 1])) for i in range(0, len(flat), 2)]


async def secrets(redis: aioredis.Redis, *, key: str, new: str) -> list[tuple[str, float]]:
    """The secrets signing now, as (secret, until): the current one first (until inf), then
    the rotated-out ones, newest first. `new` becomes the current one when there is none."""
    return _secrets(await WEBHOOK_SECRETS.run(redis, [key], [new]))


async def rotate(redis: aioredis.Redis, *, key: str, new: str, overlap_seconds: float,
                 keep_retired: int) -> list[tuple[str, float]]:
    """Make `new` the current secret; the one it replaces signs for `overlap_seconds` more.
    What `secrets` returns, after the rotation."""
    return _secrets(await WEBHOOK_SECRET_ROTATE.run(
        redis, [key], [new, repr(float(overlap_seconds)), keep_retired]))
