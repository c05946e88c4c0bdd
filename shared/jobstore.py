"""The job store: jobs, their sub-results and the sub-request leases, in Redis.

Every change is one atomic Lua script (shared/redis_scripts/). Timestamps are epoch seconds of
the Redis server's clock (its TIME, read inside the scripts), so that hosts whose clocks disagree
still agree on when a lease or a deadline ran out.
"""

import itertools
import json
import time
from dataclasses import dataclass, field, replace
from typing import Any

import redis.asyncio as aioredis

from shared import names
from shared import redis_replies as replies
from shared.errors import InvalidTransition, JobNotFound, NotReplicated
from shared.job import FINAL_STATUSES, JobMeta, JobStatus, SubRequestTiming, WebhookDelivery
from shared.job_log import JobEnd, job_ended
from shared.messages import (
    DeadLetter,
    JobError,
    LeaseOutcome,
    StatusEvent,
    SubRequest,
    SubResult,
)
from shared.redis_scripts import backlog, jobs, leases
from shared.redis_scripts.jobs import Enqueue, Finished
from shared.settings import get_settings
from shared.throughput import bucket_ttl
from shared.timeline import timeline_in
from shared.token_bucket import TokenBucket
from shared.usage import DAY_SECONDS

# A deadline or a dispatch the janitor took but did not finish with is due again this much later.
RETRY_CLAIM_SECONDS = 30.0
# A final job's sub-results are kept this long, not for the record's TTL: the
# record's output holds every output, and these only say how it ran (for a reader that raced
# its end, or an operator looking right after). ~700 B of each finished job's ~2 KB.
RAN_TTL_SECONDS = 300
JOBS_INDEX_SIZE = 1000  # recent jobs listed per API key
TRIM_INDEX_EVERY = 16  # creates between two trims of an owner's index (it may pass the size
# by what this many creates add, per replica, in between)


__all__ = ["Enqueue", "Finished", "JobRecord", "JobStore", "LeaseGrant", "NewJob"]


@dataclass(frozen=True)
class NewJob:
    """A job to store (JobStore.create). `watched`: a live event stream listens to it from the
    start (see JobStore.watch)."""

    id: str
    task: str
    model: str
    input: dict[str, Any]
    total: int
    meta: JobMeta | None = None
    watched: bool = False


@dataclass
class JobRecord:
    id: str
    task: str
    model: str
    status: JobStatus
    input: dict[str, Any]
    total: int
    created_at: float
    done: int = 0
    started_at: float | None = None
    completed_at: float | None = None
    output: list[dict[str, Any] | None] | None = None
    error: JobError | None = None
    meta: JobMeta = field(default_factory=JobMeta)
    webhook_deliveries: list[WebhookDelivery] = field(default_factory=list)
    timeline: list[SubRequestTiming] | None = None  # read only when asked (JobStore.get)

    @property
    def final(self) -> bool:
        return self.status in FINAL_STATUSES


@dataclass
class LeaseGrant:
    outcome: LeaseOutcome
    attempt: int = 0  # the attempt this is (acquired) or would have been (exhausted)
    watched: bool = True  # acquired: the job's live events are wanted (watched.lua)
    charged: bool = False  # acquired: its attempt was charged with the lease


def _f(v: bytes | None) -> float | None:
    return float(v) if v else None


class JobStore:
    def __init__(self, redis: aioredis.Redis, finished_ttl: int = 7 * 24 * 3600) -> None:
        self.redis = redis
        self.finished_ttl = finished_ttl
        settings = get_settings()
        self._ttls = jobs.Ttls(finished=finished_ttl,
                               ran=min(finished_ttl, RAN_TTL_SECONDS),
                               usage=settings.usage_retention_days * DAY_SECONDS,
                               throughput=bucket_ttl(settings.throughput_window_seconds))
        self._creates = itertools.count()

    # Jobs -----------------------------------------------------------------------------------

    async def create(self, job: NewJob, *, enqueue: Enqueue | None = None,
                     bucket: TokenBucket | None = None) -> JobRecord:
        """Store a new job and put its sub-requests in the model's backlog, in one step.

        With `enqueue`, its sub-request messages go onto the queue in that same step. Without,
        the caller sends them and then calls `mark_dispatched`; until then the job is marked as
        being dispatched, so that if the caller dies half-way the janitor sends the rest.
        With `bucket`, the job first takes a token from it; with none left, nothing is stored
        and RateLimited says how long until one is back.
        Called again with the same id (a retry after a lost reply), it stores and sends nothing
        and returns the job as stored. NotReplicated (holding the job) when it was stored but
        reached fewer replicas than the client waits for."""
        meta = job.meta or JobMeta()
        mapping = {
            # Defaults and nulls left out: every byte is kept per job for the record's TTL.
            "meta": meta.model_dump_json(exclude_defaults=True),
            "task": job.task,
            "model": job.model,
            "input": json.dumps(job.input),
            "total": str(job.total),
            "status": JobStatus.QUEUED.value,
            # created_at: the Redis server's time, set by the script
            "done": "0",  # kept equal to the size of its results hash by store_result.lua
            # The webhook events the job wants, read by the scripts (acquire_lease.lua).
            "hooks": ",".join(meta.webhook_events_filter) if meta.webhook else "",
            # What making it final involves, for a script that does so without reading `meta`
            # (store_result.lua, for a job of one sub-request); r: its sub-requests' attempts
            # are kept in this record.
            "fin": _final_flags(meta) + "r",
        }
        if job.watched:
            mapping["watch"] = "1"
        trim = next(self._creates) % TRIM_INDEX_EVERY == 0
        created, replication = await jobs.create_job(
            self.redis,
            row=jobs.JobRow(job_id=job.id, model=job.model, owner=meta.owner, total=job.total,
                            fields=[x for kv in mapping.items() for x in kv],
                            deadline_seconds=meta.deadline_seconds),
            enqueue=enqueue, bucket=bucket, trim_index_to=JOBS_INDEX_SIZE if trim else None,
        )
        if created < 0:
            assert bucket is not None, "only a rate limit refuses a job"
            raise bucket.refusal(-created)
        if created == 0:
            return await self.get(job.id)
        rec = JobRecord(job.id, job.task, job.model, JobStatus.QUEUED, job.input, job.total,
                        created, meta=meta)
        if replication.short:
            raise NotReplicated(replication.acked, replication.wanted, replication.timeout_ms,
                                job=rec)
        return rec

    async def recent(self, owner: str | None, limit: int) -> list[JobRecord]:
        """The owner's most recent jobs, newest first (expired ones are skipped)."""
        ids = replies.raw_list(await self.redis.zrevrange(names.jobs_index_key(owner), 0,
                                                          limit - 1))
        out = []
        for job_id in ids:
            try:
                out.append(await self.get(job_id.decode()))
            except JobNotFound:
                await self.redis.zrem(names.jobs_index_key(owner), job_id)
        return out

    async def mark_dispatched(self, job_id: str) -> None:
        await self.redis.zrem(names.DISPATCHING, job_id)

    async def claim_stale_dispatches(self, older_than: float, limit: int = 100) -> list[str]:
        """Jobs whose creator died before it finished sending their sub-requests. Each is
        taken by one caller and stays marked (due again after RETRY_CLAIM_SECONDS) until that
        caller's `mark_dispatched`."""
        return await self._claim(names.DISPATCHING, older_than, limit)

    async def _claim(self, key: str, age: float, limit: int) -> list[str]:
        return await backlog.claim_due(self.redis, key=key, age=age,
                                       retry_seconds=RETRY_CLAIM_SECONDS, limit=limit)

    async def get(self, job_id: str, timeline: bool = False) -> JobRecord:
        """The job as stored: one HGETALL, plus a second round trip only for a job with a
        webhook (its delivery attempts) or one stored before jobs counted their results.
        `timeline`: with each sub-request's timing, read from the same HGETALL."""
        raw = replies.raw_hash(await self.redis.hgetall(names.job_key(job_id)))
        rec = _record(job_id, raw)
        if timeline:
            rec.timeline = timeline_in(raw, rec.total, rec.created_at)
        legacy = b"done" not in raw
        if rec.meta.webhook is None and not legacy:
            return rec
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.lrange(names.webhooks_key(job_id), 0, -1)
            if legacy:
                pipe.hlen(names.results_key(job_id))
            got = await pipe.execute()
        rec.webhook_deliveries = [WebhookDelivery.model_validate_json(d) for d in got[0]]
        if legacy:
            rec.done = rec.total if rec.status == JobStatus.SUCCEEDED else got[1]
        return rec

    async def get_with_results(self, job_id: str) -> tuple[JobRecord, dict[int, SubResult]]:
        """The job (without its webhook deliveries) and its sub-results, in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(names.job_key(job_id))
            pipe.hgetall(names.results_key(job_id))
            raw, results = await pipe.execute()
        rec = _record(job_id, raw)
        # Read after the job: results are only ever added, so this is the newer figure.
        rec.done = len(results)
        return rec, {int(k): SubResult.model_validate_json(v) for k, v in results.items()}

    async def finalize(
        self,
        job_id: str,
        status: JobStatus,
        output: list[dict[str, Any] | None],
        error: JobError | None = None,
        *,
        rec: JobRecord | None = None,
        all_results: bool = False,
    ) -> bool:
        """Set a final status with its output once; returns False if the job already was final.
        See `finalize_record` for `rec` and `all_results`."""
        return await self.finalize_record(job_id, status, output, error, rec=rec,
                                          all_results=all_results) is not None

    async def finalize_record(
        self,
        job_id: str,
        status: JobStatus,
        output: list[dict[str, Any] | None],
        error: JobError | None = None,
        *,
        rec: JobRecord | None = None,
        all_results: bool = False,
    ) -> JobRecord | None:
        """Set a final status with its output once; returns the job as it became final, or None
        if it already was final.

        `rec`, the job as the caller read it, spares the script the work the job does not need
        (no deadline, no webhook, no images) and the read of its model; `all_results` says every
        sub-result is stored, so none is left in the backlog."""
        if status not in FINAL_STATUSES:
            raise InvalidTransition(f"{status} is not a final status")
        if rec is None:
            rec = await self.get(job_id)
            flags = "*"
        else:
            flags = _final_flags(rec.meta) + ("" if all_results else "k")
        completed = await jobs.finalize(
            self.redis, job_id=job_id, model=rec.model,
            final=jobs.FinalState(status.value, json.dumps(output),
                                  error.model_dump_json() if error else None),
            flags=flags, ttls=self._ttls,
        )
        if completed is None:
            return None
        job_ended(JobEnd(job_id, rec.task, rec.model, status.value, rec.created_at,
                         rec.started_at, completed, error.code if error else None))
        return replace(rec, status=status, output=output, error=error, completed_at=completed)

    async def record_delivery(self, job_id: str, delivery: WebhookDelivery) -> None:
        """Append a webhook attempt to the job; it expires with the job."""
        key = names.webhooks_key(job_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.rpush(key, delivery.model_dump_json())
            pipe.expire(key, self.finished_ttl)
            await pipe.execute()

    async def claim_due_deadlines(self, limit: int = 100) -> list[str]:
        """Jobs past their deadline, each taken by one caller; a job stays listed (due again
        after RETRY_CLAIM_SECONDS) until it is final (finalize.lua removes it) or
        `deadline_done`."""
        return await self._claim(names.DEADLINES, 0.0, limit)

    async def deadline_done(self, job_id: str) -> None:
        """The job needs no deadline any more (it was final, or gone, when its deadline came)."""
        await self.redis.zrem(names.DEADLINES, job_id)

    # Sub-results ----------------------------------------------------------------------------

    async def store_result(self, job_id: str, result: SubResult, model: str | None = None,
                           event: str | None = None) -> int:
        """Write a sub-result once per (job, index): 1 written, 0 duplicate, -1 gone, -2 final.
        The writer's lease on it (`result.worker`) is released in the same step. `model`, the
        job's model when the caller knows it, saves reading it first. `event`, an encoded event
        for the job's channel, is published in the same step when the result is written."""
        got = await self._store(job_id, result, model, event, None)
        assert isinstance(got, int)
        return got

    async def store_last_result(self, job_id: str, result: SubResult, output: dict[str, Any],
                                model: str | None = None,
                                event: str | None = None) -> int | Finished:
        """`store_result` for a successful sub-result whose job `output` is known from it
        alone: a job of this one sub-request succeeds in the same step (Finished says when),
        with no joiner involved; any other job gets the sub-result as `store_result` writes it.
        A job stored without a `fin` field (by an older API) always takes the second path."""
        return await self._store(job_id, result, model, event, [output])

    async def _store(self, job_id: str, result: SubResult, model: str | None,
                     event: str | None, output: list[dict[str, Any]] | None) -> int | Finished:
        model = model or await self._model(job_id)
        stored = await jobs.store_result(
            self.redis, job_id=job_id, model=model, result=result,
            output_json=json.dumps(output) if output is not None else None, event=event,
            ttls=self._ttls,
        )
        if isinstance(stored, Finished):
            job_ended(JobEnd(job_id, stored.task, model, JobStatus.SUCCEEDED.value,
                             stored.created_at, stored.started_at, stored.completed_at))
        return stored

    async def _model(self, job_id: str) -> str:
        """The job's model, for its backlog's key. A job's model never changes, so reading it
        before the script that uses the key is safe; a job that is gone names no model, and the
        scripts return before touching the key."""
        model = replies.optional_text(await self.redis.hget(names.job_key(job_id), "model"))
        return model or ""

    async def results(self, job_id: str) -> dict[int, SubResult]:
        raw = replies.raw_hash(await self.redis.hgetall(names.results_key(job_id)))
        return {int(k): SubResult.model_validate_json(v) for k, v in raw.items()}

    async def has_result(self, job_id: str, index: int) -> bool:
        return bool(await self.redis.hexists(names.results_key(job_id), index))

    async def result(self, job_id: str, index: int) -> SubResult | None:
        raw = replies.optional_raw(await self.redis.hget(names.results_key(job_id), index))
        return SubResult.model_validate_json(raw) if raw is not None else None

    # Leases ---------------------------------------------------------------------------------

    async def acquire_lease(
        self, sub: SubRequest, worker: str, lease_seconds: float, max_attempts: int,
        charge: bool = False,
    ) -> LeaseGrant:
        """Lease the sub-request to `worker`; with `charge`, also charge its attempt in the same
        step (it starts on the device at once: acquire_lease.lua)."""
        running = StatusEvent(data={"id": sub.job_id, "status": JobStatus.RUNNING.value})
        got = await leases.acquire_lease(self.redis, sub=sub, worker=worker,
                                         lease_seconds=lease_seconds, max_attempts=max_attempts,
                                         charge=charge, running_event=running.encode())
        counted = got.outcome in (LeaseOutcome.ACQUIRED, LeaseOutcome.EXHAUSTED)
        return LeaseGrant(got.outcome, int(got.detail) if counted else 0,
                          watched=got.watched,
                          charged=charge and got.outcome == LeaseOutcome.ACQUIRED)

    async def watch(self, job_id: str) -> bool:
        """A live event stream watches the job: its events are published from now on (the
        scripts', and, told on `names.WATCH_CHANNEL`, its workers'). A job nobody watches has
        none made. False when it is final or gone."""
        return await jobs.watch_job(self.redis, job_id=job_id)

    async def renew_leases(self, members: list[str], worker: str, lease_seconds: float) -> int:
        if not members:
            return 0
        return await leases.renew_leases(self.redis, members=members, worker=worker,
                                         lease_seconds=lease_seconds)

    async def charge_attempts(self, members: list[str], worker: str) -> int:
        """Charge an attempt to each of `members` this worker leases: they start on the
        device now. Returns how many were charged."""
        if not members:
            return 0
        return await leases.charge_attempts(self.redis, members=members, worker=worker)

    async def mark_sent(self, model: str, members: list[str]) -> None:
        """These outstanding sub-requests are being sent again: they count as sent now."""
        if members:
            await backlog.mark_sent(self.redis, model=model, members=members)

    async def claim_lost(self, model: str, member: str, sent: float) -> bool:
        """Take an outstanding sub-request that `sent` (its backlog score as read) says was
        sent long ago and that no lease holds, to send it again; see claim_lost.lua."""
        return await backlog.claim_lost(self.redis, model=model, member=member, sent=sent)

    async def release_lease(self, member: str, worker: str) -> bool:
        return await leases.release_lease(self.redis, member=member, worker=worker)

    async def hand_back_lease(self, sub: SubRequest, worker: str, new_owner: str,
                              charged: bool) -> bool:
        """Expire `worker`'s lease on `sub` at once, owned by `new_owner` from now on, and give
        back the attempt it was `charged` (if it started). False when `worker` no longer held
        it."""
        return await leases.hand_back_lease(self.redis, sub=sub, worker=worker,
                                            new_owner=new_owner, charged=charged)

    async def claim_expired_leases(self, owner: str = "janitor:", hold_seconds: float = 30.0,
                                   limit: int = 100) -> list[tuple[str, int]]:
        """Expired leases, each now held by `owner` (a `janitor:` name) for `hold_seconds`
        while it sends the sub-request again; it gives them up with `release_lease`."""
        # Read first, so that the script that takes them is told the records it writes; it
        # takes only those still expired when it runs.
        first = await leases.expired_leases(self.redis, limit=limit)
        if not first:
            return []
        members = await leases.claim_expired(self.redis, members=first, owner=owner,
                                             hold_seconds=hold_seconds)
        out = []
        for m in members:
            job_id, index = names.split_member(m)
            out.append((job_id, int(index)))
        return out

    async def attempts(self, job_id: str, index: int) -> int:
        got = await self.redis.hget(names.job_key(job_id), names.attempts_field(index))
        return int(replies.optional_raw(got) or 0)

    async def lease_owner(self, job_id: str, index: int) -> str | None:
        """Who holds the sub-request's lease, if anyone (it may have expired)."""
        owner = await self.redis.hget(names.job_key(job_id), names.owner_field(index))
        return replies.optional_text(owner) or None

    async def lease_owners(self, job_id: str) -> dict[int, str]:
        """Who holds the lease of each of the job's sub-requests that one holds."""
        return lease_owners_in(replies.raw_hash(await self.redis.hgetall(names.job_key(job_id))))

    async def dead_letter(self, sub: SubRequest, result: SubResult, *, attempts: int,
                          keep: int) -> int:
        """Give a sub-request up: keep it in the dead-letter list for an operator (the newest
        `keep` entries stay), and store its failure as its result (see `store_result` for the
        return value)."""
        entry = DeadLetter.of(sub, result.error, attempts=attempts, at=time.time())
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.lpush(names.DEAD_LETTER, entry.encode())
            pipe.ltrim(names.DEAD_LETTER, 0, keep - 1)
            await pipe.execute()
        return await self.store_result(sub.job_id, result, model=sub.model)


def _final_flags(meta: JobMeta) -> str:
    """What finalize.lua does for a job besides its status: w webhook deliveries to keep with
    the record, d a deadline to drop, f a `completed` webhook to announce."""
    return "".join((
        "w" if meta.webhook is not None else "",
        "d" if meta.deadline_seconds is not None else "",
        "f" if meta.wants("completed") else "",
    ))


def _record(job_id: str, raw: dict[bytes, bytes]) -> JobRecord:
    """A job from its hash (HGETALL); `done` as the scripts keep it, webhook deliveries not
    read."""
    if not raw or b"task" not in raw:
        raise JobNotFound(job_id)
    h = {k.decode(): v for k, v in raw.items()}
    return JobRecord(
        id=job_id,
        task=h["task"].decode(),
        model=h["model"].decode(),
        status=JobStatus(h["status"].decode()),
        input=json.loads(h["input"]),
        total=int(h["total"]),
        created_at=float(h["created_at"]),
        done=int(h["done"]) if h.get("done") else 0,
        started_at=_f(h.get("started_at")),
        completed_at=_f(h.get("completed_at")),
        output=json.loads(h["output"]) if h.get("output") else None,
        error=JobError.model_validate_json(h["error"]) if h.get("error") else None,
        meta=JobMeta.model_validate_json(h["meta"]) if h.get("meta") else JobMeta(),
    )


def _per_index(raw: dict[bytes, bytes], prefix: str) -> dict[int, bytes]:
    """The fields of a job's record (as HGETALL reads it) named `prefix` + an index."""
    p = prefix.encode()
    return {int(k[len(p):]): v for k, v in raw.items() if k.startswith(p)}


def lease_owners_in(raw: dict[bytes, bytes]) -> dict[int, str]:
    """The lease owners in a job's record, by sub-request index."""
    return {i: v.decode() for i, v in _per_index(raw, names.OWNER_FIELD).items() if v}


def attempts_in(raw: dict[bytes, bytes]) -> dict[int, int]:
    """The attempts in a job's record, by sub-request index."""
    return {i: int(v) for i, v in _per_index(raw, names.ATTEMPTS_FIELD).items()}
