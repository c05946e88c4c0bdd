"""Wrappers of the scripts that create a job, make it final, store its sub-results and watch it
(scripts/create_job.lua, finalize.lua, store_result.lua, watch_job.lua). Each derives its keys
and channels from the job's id and model (shared/names.py)."""

from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from shared import names
from shared import redis_replies as replies
from shared.errors import JobNotFound
from shared.messages import CancelNotice, SubResult
from shared.redis_scripts.loader import Script
from shared.replication import Replication
from shared.throughput import BUCKET_SECONDS
from shared.timeline import ran_value
from shared.token_bucket import TokenBucket
from shared.usage import DAY_SECONDS, subresult_usage

CREATE_JOB = Script("create_job")
FINALIZE = Script("finalize")
STORE_RESULT = Script("store_result")
WATCH_JOB = Script("watch_job")


def _opt(value: float | None) -> str:
    """An optional number as the scripts take it: '' for none; a float's repr keeps it exact."""
    return "" if value is None else repr(value)


@dataclass(frozen=True)
class Ttls:
    finished: int  # a final job's record and webhook deliveries
    ran: int  # what ran it: its sub-results, an older API's attempts hash
    usage: int = 400 * DAY_SECONDS  # a day's usage counters, after their last change
    throughput: int = 125  # a model's count of sub-requests finished in a bucket


# create_job.lua -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Enqueue:
    """The sub-request messages to push onto the queue in the step that stores their job."""

    queue: str  # the Redis list (kombu's list for the job's model and priority)
    messages: list[bytes]


@dataclass(frozen=True)
class JobRow:
    """A job as create_job.lua stores it."""

    job_id: str
    model: str
    owner: str | None
    total: int
    fields: Sequence[str]  # the record's field/value items (created_at is the script's)
    deadline_seconds: float | None = None


async def create_job(redis: aioredis.Redis, *, row: JobRow, enqueue: Enqueue | None,
                     bucket: TokenBucket | None, trim_index_to: int | None
                     ) -> tuple[float, Replication]:
    """The time the job was created, and how many replicas hold it; 0.0 when it existed
    already (nothing was done); with no token left in `bucket`, minus the seconds until one is
    back (nothing was stored).
    `enqueue` None: the caller sends the messages itself (the job is marked as dispatching).
    `trim_index_to` None: the owner's index is not trimmed this time."""
    reply, replication = await CREATE_JOB.run_durably(
        redis,
        [names.job_key(row.job_id), names.backlog_key(row.model),
         names.jobs_index_key(row.owner), names.DEADLINES, names.DISPATCHING,
         enqueue.queue if enqueue else names.DISPATCHING,
         bucket.key if bucket else names.DISPATCHING],
        [row.job_id, f"{bucket.rate!r} {bucket.burst}" if bucket else "", row.total,
         _opt(row.deadline_seconds), _opt(trim_index_to), "1" if enqueue else "0",
         len(row.fields), *row.fields, *(enqueue.messages if enqueue else ())],
    )
    created = float(reply) if isinstance(reply, int) else float(replies.text(reply))
    return created, replication


# finalize.lua -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FinalState:
    status: str
    output_json: str
    error_json: str | None = None


async def finalize(redis: aioredis.Redis, *, job_id: str, model: str, final: FinalState,
                   flags: str, ttls: Ttls) -> float | None:
    """When the job became final (completed_at); None when it already was; JobNotFound when it
    is gone. `flags`: '*' for anything, else what the job has: w webhook deliveries, d a
    deadline, f a `completed` webhook, k outstanding sub-requests in `model`'s backlog."""
    reply, _ = await FINALIZE.run_durably(
        redis,
        [names.job_key(job_id), names.results_key(job_id), names.attempts_key(job_id),
         names.webhooks_key(job_id), names.COMPLETIONS_STREAM, names.backlog_key(model),
         names.DEADLINES],
        [final.status, final.output_json, final.error_json or "", ttls.finished, job_id, flags,
         names.FINAL_CHANNEL, names.CANCEL_CHANNEL, CancelNotice(job_id=job_id).encode(),
         ttls.ran, ttls.usage],
    )
    if reply == -1:
        raise JobNotFound(job_id)
    if reply == 0:
        return None
    return float(replies.text(reply))


# store_result.lua ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Finished:
    """A job that became final (succeeded) in the step that stored its one result."""

    task: str
    created_at: float
    started_at: float | None
    completed_at: float


async def store_result(redis: aioredis.Redis, *, job_id: str, model: str, result: SubResult,
                       output_json: str | None, event: str | None, ttls: Ttls) -> int | Finished:
    """1 written, 0 a duplicate, -1 the job is gone, -2 it is final; Finished when this result
    made a job of one sub-request final (only with `output_json`, the job's output from it).
    `event` is published on the job's channel with the result, when its live events are
    wanted."""
    reply, _ = await STORE_RESULT.run_durably(
        redis,
        [names.job_key(job_id), names.results_key(job_id), names.COMPLETIONS_STREAM,
         names.LEASES, names.backlog_key(model), names.attempts_key(job_id),
         names.webhooks_key(job_id), names.DEADLINES],
        [result.index, result.model_dump_json(exclude_none=True), job_id, int(result.ok),
         f"{job_id}:{result.index}", result.worker,
         names.events_channel(job_id) if event else "", event or "", output_json or "",
         ttls.finished, ttls.ran, names.FINAL_CHANNEL, names.owner_field(result.index),
         ttls.usage, subresult_usage(result), f"{BUCKET_SECONDS} {ttls.throughput}",
         names.ran_field(result.index),
         ran_value(result.run_started_at or result.started_at, result.finished_at,
                   result.worker)],
    )
    if not isinstance(reply, list):
        return replies.integer(reply)
    completed, created, started, task = replies.texts(reply)
    return Finished(task=task, created_at=float(created),
                    started_at=float(started) if started else None,
                    completed_at=float(completed))


# watch_job.lua ------------------------------------------------------------------------------


async def watch_job(redis: aioredis.Redis, *, job_id: str) -> bool:
    """False when the job is final or gone (nothing was written)."""
    reply = await WATCH_JOB.run(redis, [names.job_key(job_id)], [names.WATCH_CHANNEL, job_id])
    return replies.integer(reply) == 1
