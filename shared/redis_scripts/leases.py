"""Wrappers of the sub-request lease scripts (scripts/acquire_lease.lua, charge_attempts.lua,
renew_leases.lua, release_lease.lua, hand_back_lease.lua, expired_leases.lua,
claim_expired.lua). A lease is named by its member, `<job id>:<index>`."""

from dataclasses import dataclass

import redis.asyncio as aioredis

from shared import names
from shared import redis_replies as replies
from shared.messages import LeaseOutcome, SubRequest
from shared.redis_scripts.loader import Script

ACQUIRE_LEASE = Script("acquire_lease")
CHARGE_ATTEMPTS = Script("charge_attempts")
RENEW_LEASES = Script("renew_leases")
RELEASE_LEASE = Script("release_lease")
HAND_BACK_LEASE = Script("hand_back_lease")
EXPIRED_LEASES = Script("expired_leases")
CLAIM_EXPIRED = Script("claim_expired")


def _job_key(member: str) -> str:
    return names.job_key(names.split_member(member)[0])


def _owner_field(member: str) -> str:
    return names.owner_field(names.split_member(member)[1])


def _with_owner_fields(members: list[str]) -> list[str]:
    """Each member followed by its owner field, as the lease scripts take them."""
    return [x for m in members for x in (m, _owner_field(m))]


@dataclass(frozen=True)
class Acquired:
    outcome: LeaseOutcome
    detail: str  # acquired/exhausted: the attempt count; busy: the owner; final: the status
    watched: bool  # acquired: the job's live events are wanted


async def acquire_lease(redis: aioredis.Redis, *, sub: SubRequest, worker: str,
                        lease_seconds: float, max_attempts: int, charge: bool,
                        running_event: str) -> Acquired:
    """Lease `sub` to `worker`; with `charge`, charge its attempt in the same write.
    `running_event` is published on the job's channel if this moves the job to running."""
    reply = replies.texts(await ACQUIRE_LEASE.run(
        redis,
        [names.job_key(sub.job_id), names.results_key(sub.job_id), names.LEASES,
         names.COMPLETIONS_STREAM],
        [sub.index, sub.member, worker, repr(lease_seconds), max_attempts, sub.job_id,
         names.owner_field(sub.index), names.attempts_field(sub.index),
         names.events_channel(sub.job_id), running_event, "1" if charge else "0",
         names.leased_field(sub.index)],
    ))
    outcome, detail, *live = reply
    return Acquired(LeaseOutcome(outcome), detail, watched=live == ["1"])


async def charge_attempts(redis: aioredis.Redis, *, members: list[str], worker: str) -> int:
    """How many of `members` (this worker's leases) were charged an attempt."""
    fields = []
    for m in members:
        index = names.split_member(m)[1]
        fields += [names.owner_field(index), names.attempts_field(index)]
    return replies.integer(await CHARGE_ATTEMPTS.run(
        redis, [_job_key(m) for m in members], [worker, *fields]))


async def renew_leases(redis: aioredis.Redis, *, members: list[str], worker: str,
                       lease_seconds: float) -> int:
    """How many of `members` this worker still owned (those were renewed)."""
    return replies.integer(await RENEW_LEASES.run(
        redis, [names.LEASES, *(_job_key(m) for m in members)],
        [worker, repr(lease_seconds), *_with_owner_fields(members)]))


async def release_lease(redis: aioredis.Redis, *, member: str, worker: str) -> bool:
    """True when `worker` held it."""
    return replies.integer(await RELEASE_LEASE.run(
        redis, [names.LEASES, _job_key(member)], [member, worker, _owner_field(member)])) == 1


async def hand_back_lease(redis: aioredis.Redis, *, sub: SubRequest, worker: str,
                          new_owner: str, charged: bool) -> bool:
    """True when `worker` held it (it is now expired and `new_owner`'s)."""
    return replies.integer(await HAND_BACK_LEASE.run(
        redis, [names.LEASES, names.job_key(sub.job_id)],
        [sub.member, worker, new_owner, names.owner_field(sub.index),
         names.attempts_field(sub.index), "1" if charged else "0"])) == 1


async def expired_leases(redis: aioredis.Redis, *, limit: int) -> list[str]:
    """Members whose lease has expired, the earliest first (nothing is written)."""
    return replies.texts(await EXPIRED_LEASES.run(redis, [names.LEASES], [limit]))


async def claim_expired(redis: aioredis.Redis, *, members: list[str], owner: str,
                        hold_seconds: float) -> list[str]:
    """The members among `members` still expired, now held by `owner` for `hold_seconds`."""
    return replies.texts(await CLAIM_EXPIRED.run(
        redis, [names.LEASES, *(_job_key(m) for m in members)],
        [owner, repr(hold_seconds), *_with_owner_fields(members)]))
