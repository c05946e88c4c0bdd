"""The batch driver: runs each batch's lines as Fibermill jobs, a window at a time, and writes
its output and error files when they are done. Every API replica runs one (a supervised loop).

A batch that needs driving is in `fm:batches:active`. A replica takes one with a lease key
(SET NX PX, renewed every tick while it drives it); when the lease lapses (the replica died or
hangs) another takes it over. All progress is in Redis, so the new driver goes on where the
last one stopped:

- a line is submitted with the Idempotency-Key `batch-{batch_id}-{line}`: submitted again after
  a crash (before its job id was recorded) it gives back the same job;
- a submitted line's job id is in `fm:batch:{id}:jobs`; once its job is final, its output or
  error file line is built at once (job records expire), marked done (a bit in
  `fm:batch:{id}:done`) and kept in `fm:batch:{id}:lines`, by a script that counts it once and
  only for the lease holder (RECORD_LINE);
- finished lines leave Redis for parts in the blob store (parts.py) as they pile up (FLUSH), so
  Redis holds a batch's unfinished lines, not its outputs; the output and error files are put
  together from the parts, in input order, when the batch ends;
- the output and error file ids are chosen once (kept in the batch's hash), so files written
  again after a crash replace the first ones.

The input is never held whole: validation streams it through the checker (checker.py) and
writes the index of its requests beside the batch's copy of it; the driver then reads the
lines it is about to submit, a window at a time, by their offsets (batch_input.py), and keeps
the text of its unfinished lines only. Expiry is decided on Redis's clock.

The driver steps each batch it holds every tick (DriverConfig), and between ticks as soon as it
hears (from the API's event hub) that one of its lines' jobs is final: that line is written and the
room it frees is filled at once, so a batch runs as fast as its jobs do, not a tick per window.
A batch created or cancelled on this replica is taken up at once too. The tick still reads every
pending line's job: a message missed while the hub reconnected costs a tick, not a line.

At most `batch_max_in_flight` lines of a batch are submitted and not final at once; they queue
in the batch step, below every interactive priority (services/api/submission.py). A line the
API refuses (InvalidInput) goes to the error file with the status and body the synchronous
endpoint would have answered; a full queue (ServiceUnavailable) or a rate limit puts
submitting off, and the line is tried again.
"""

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from services.api.auth import Principal
from services.api.batches import jsonl, lines, parts
from services.api.batches.batch_input import WINDOW_LINES, BatchInput, Window, window
from services.api.batches.bits import Bits
from services.api.batches.checker import Checker
from services.api.batches.driver_parts import DEFAULT_CONFIG, DriverConfig, DriverParts
from services.api.batches.files import (
    BATCH,
    BATCH_OUTPUT,
    files_hour_prefix,
    new_file_id,
)
from services.api.batches.store import FINAL, OPEN_STATUSES, LeaseLost
from services.api.batches.webhook import BatchWebhooks
from services.api.openai import translate
from services.api.openai.errors import error_body, openai_error
from services.api.openai.schemas import ImageGenerationRequest
from shared import names
from shared.asyncio_compat import raise_if_cancelled
from shared.blobstore.blob import Blob
from shared.blobstore.keys import UNOWNED, hour_of
from shared.errors import (
    BlobNotFound,
    IdempotencyConflict,
    InvalidInput,
    JobNotFound,
    RateLimited,
    ServiceUnavailable,
)
from shared.job import JobStatus
from shared.jobstore import JobRecord
from shared.settings import Settings

log = logging.getLogger(__name__)

# Between ticks, a wake-up waits this long for more of its batch's jobs to end, so that a
# window ending together is written and refilled in a few steps, not one step a job.
GATHER_SECONDS = 0.01
SUBMIT_CONCURRENCY = 32
CANCELLED = ("batch_cancelled", "This request was not executed: the batch was cancelled.")
EXPIRED = ("batch_expired",
           "This request could not be executed before the completion window expired.")


@dataclass
class Driven:
    """What this replica keeps in memory about a batch it drives (rebuilt from Redis by the
    next driver)."""

    batch_id: str
    input: BatchInput | None = None  # None until read (once per driver)
    # The window: the text of the lines to submit next, and where each is in it (`len(spans)`
    # is the batch's number of requests).
    content: bytes | None = None
    spans: Window = field(default_factory=Window)
    raw: dict[int, jsonl.Raw] = field(default_factory=dict)  # the pending lines' text
    pending: dict[int, str] = field(default_factory=dict)  # line index -> job id
    jobs: set[str] = field(default_factory=set)  # the pending lines' job ids
    heard: set[str] = field(default_factory=set)  # of those, heard final since its last step
    done: Bits = field(default_factory=Bits)
    next: int = 0  # every line below it is submitted or done
    backoff_until: float = 0.0
    unflushed_since: float | None = None  # when finished lines were first seen in Redis

    def submitted(self, i: int, job_id: str) -> None:
        self.pending[i] = job_id
        self.jobs.add(job_id)
        if self.content is not None and i in self.spans:
            span = self.spans[i]
            self.raw[i] = jsonl.Raw(span.line, self.content[span.start:span.end])

    def settled(self, i: int) -> None:
        job_id = self.pending.pop(i, None)
        if job_id is not None:
            self.jobs.discard(job_id)
            self.heard.discard(job_id)
        self.raw.pop(i, None)
        self.done.add(i)


def input_copy_key(batch_id: str, owner: str | None, created: int) -> str:
    """The batch's own copy of its input: deleting the input file does not stop the batch;
    swept with the files of its hour."""
    return f"{files_hour_prefix(hour_of(created))}{owner or UNOWNED}/{batch_id}.input.jsonl"


def input_index_key(batch_id: str, owner: str | None, created: int) -> str:
    """Where each request of the batch's copy of its input is (checker.py), beside it."""
    return f"{files_hour_prefix(hour_of(created))}{owner or UNOWNED}/{batch_id}.input.index"


def _owner(h: dict[str, str]) -> str | None:
    return h.get("owner") or None


class BatchDriver:
    def __init__(self, parts: DriverParts, settings: Settings, consumer: str,
                 config: DriverConfig = DEFAULT_CONFIG) -> None:
        self.batches = parts.batches
        self.files = parts.files
        self.blobs = parts.blobs
        self.store = parts.store
        self.submissions = parts.submissions
        self.lifecycle = parts.lifecycle
        self.registry = parts.registry
        self.settings = settings
        self.me = consumer
        self.tick_seconds = config.tick_seconds
        self.lease_ms = config.lease_ms
        self.max_driven = config.max_driven
        self.flush_lines = config.flush_lines
        self.flush_seconds = config.flush_seconds
        self.held: dict[str, Driven] = {}
        self.webhooks = BatchWebhooks(self.batches.redis, self.batches, settings)
        self._woken = asyncio.Event()  # a line's job ended, or a batch changed here
        self._changed = False  # a batch was created or cancelled here: tick now
        self.batches.watch(self._batch_changed)
        if parts.hub is not None:
            parts.hub.observe_finals(self._job_final)

    def _batch_changed(self) -> None:
        self._changed = True
        self._woken.set()

    def _job_final(self, job_id: str) -> None:
        for d in self.held.values():
            if job_id in d.jobs:
                d.heard.add(job_id)
                self._woken.set()
                return

    async def run(self) -> None:
        try:
            while True:
                await self.tick()
                raise_if_cancelled()  # one its Redis calls dropped (shared/asyncio_compat.py)
                await self._between_ticks(time.monotonic() + self.tick_seconds)
        finally:
            # Leaving (shutdown): hand the batches over now rather than when leases lapse.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._release_all(), 2.0)
            await self.webhooks.aclose()

    async def _between_ticks(self, next_tick: float) -> None:
        """Until `next_tick`, step the batches whose lines' jobs were heard final; return at
        once when a batch was created or cancelled here."""
        while not self._changed:
            left = next_tick - time.monotonic()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._woken.wait()
            if not self._woken.is_set():
                return
            # Cleared before stepping: a job heard final during the steps wakes the next wait.
            self._woken.clear()
            if self._changed:
                break
            await asyncio.sleep(GATHER_SECONDS)
            for d in [d for d in self.held.values() if d.heard]:
                try:
                    await self._step_heard(d)
                except LeaseLost:
                    log.warning("batch %s: lease lost; another replica drives it", d.batch_id)
                    self.held.pop(d.batch_id, None)
                except Exception:  # the next tick reads every pending line again
                    log.exception("batch %s: step between ticks failed", d.batch_id)
                raise_if_cancelled()
        self._changed = False

    async def _step_heard(self, d: Driven) -> None:
        """Write the lines whose jobs were heard final and submit the lines that makes room
        for; anything else a batch may need (cancelling, expiry) is left to the tick."""
        h = await self.batches.find(d.batch_id)
        if (h is None or h["status"] != "in_progress" or d.input is None
                or await self.batches.now() >= int(h["expires_at"])):
            return
        await self._advance_lines(d, h, heard=True)

    async def _release_all(self) -> None:
        for batch_id in list(self.held):
            await self.batches.release(batch_id, self.me)
        self.held.clear()

    async def tick(self) -> None:
        """Take the batches no replica drives (up to max_driven), renew the leases held, and
        move each batch held one step on."""
        for batch_id in await self.batches.active():
            if len(self.held) >= self.max_driven:
                break
            if batch_id not in self.held and await self.batches.claim(batch_id, self.me,
                                                                        self.lease_ms):
                log.info("batch %s: driven by %s", batch_id, self.me)
                self.held[batch_id] = Driven(batch_id)
        for batch_id, d in list(self.held.items()):
            if not await self.batches.renew(batch_id, self.me, self.lease_ms):
                self.held.pop(batch_id, None)
                continue
            try:
                if not await self.step(d):
                    self.held.pop(batch_id, None)
            except LeaseLost:
                log.warning("batch %s: lease lost; another replica drives it", batch_id)
                self.held.pop(batch_id, None)
            except Exception:
                # Redis or the store hiccuped: the same step runs again next tick.
                log.exception("batch %s: step failed; retrying", batch_id)

    async def step(self, d: Driven) -> bool:
        """One step of a batch; False when it needs no more driving."""
        h = await self.batches.find(d.batch_id)
        if h is None:
            await self.batches.forget(d.batch_id)
            return False
        status = h["status"]
        if status in FINAL:
            # Ended (by the step before, or by a replica that died before this): its webhook,
            # then what only running it needed goes.
            if not await self.webhooks.settle(h):
                return True
            await self.blobs.delete([*(h[k] for k in ("input_key", "index_key") if h.get(k)),
                                     *await self.batches.parts(d.batch_id)])
            await self.batches.retire(d.batch_id)
            return False
        # On Redis's clock, which every replica shares (their own may disagree).
        if status in OPEN_STATUSES and await self.batches.now() >= int(h["expires_at"]):
            # Before the input is read: a batch past its window has no use for it.
            await self._expire(d, h, status)
        elif status == "validating":
            if await self._validate(d, h):
                return await self.step(d)  # in progress (its first lines go now) or failed
        elif not await self._load(d, h):
            pass
        elif status == "finalizing":
            await self._finish(d, h, "finalizing", "completed")
        elif status == "cancelling":
            await self._stop(d, h, CANCELLED)
            await self._finish(d, h, "cancelling", "cancelled")
        else:
            await self._advance_lines(d, h)
        return True

    async def _advance_lines(self, d: Driven, h: dict[str, str], heard: bool = False) -> None:
        """Write the lines whose jobs ended (those heard final, or all whose jobs are final),
        submit more, and finish the batch when every line is done."""
        if heard:
            for i, job_id in [(i, j) for i, j in d.pending.items() if j in d.heard]:
                await self._settle(d, i, job_id)
        else:
            await self._poll(d)
        await self._read_window(d)
        await self._submit(d, h)
        if len(d.done) >= len(d.spans) and await self.batches.transition(
                d.batch_id, "in_progress", "finalizing"):
            await self._finish(d, h, "finalizing", "completed")
        else:
            await self._flush(d, h)

    # Validating -------------------------------------------------------------------------------

    async def _validate(self, d: Driven, h: dict[str, str]) -> bool:
        """Check the input file; True when the batch moved on (in progress, or failed)."""
        owner = _owner(h)
        meta = await self.files.find(h["input_file_id"])
        if meta is None or (owner is not None and meta.owner != owner):
            return await self._fail(d, "input_file_id", "file_not_found",
                                    f"input file {h['input_file_id']} was not found (deleted "
                                    "or expired)")
        if meta.purpose != BATCH:
            return await self._fail(d, "input_file_id", "invalid_file_purpose",
                                    f"input file {meta.id} has purpose {meta.purpose!r}, "
                                    "not 'batch'")
        try:
            blob = await self.files.open(meta)
        except BlobNotFound:
            return await self._fail(d, "input_file_id", "file_not_found",
                                    f"the content of input file {meta.id} is gone")
        checker = await self._check(blob)
        try:
            total = checker.close()
        except InvalidInput as exc:
            return await self._fail(d, "input_file_id", "invalid_request",
                                    *[p.message for p in exc.problems])
        created = int(h["created_at"])
        key = input_copy_key(d.batch_id, owner, created)
        index_key = input_index_key(d.batch_id, owner, created)
        await self.blobs.copy(meta.key, key)
        await self.blobs.put(index_key, checker.index())
        # The count too: a batch cancelled before it moves on still names each of its lines.
        await self.batches.set_fields(d.batch_id, input_key=key, index_key=index_key,
                                      total=total)
        if not await self.batches.transition(d.batch_id, "validating", "in_progress",
                                             total=total):
            return False  # cancelled meanwhile: the next step ends it as cancelled
        log.info("batch %s: %d requests, in progress", d.batch_id, total)
        return True

    async def _check(self, blob: Blob) -> Checker:
        """The input streamed through the checker, a chunk at a time off the event loop."""
        checker = Checker(self.settings.max_body_bytes)
        async with blob:
            async for chunk in blob:
                await asyncio.to_thread(checker.feed, chunk)
        return checker

    async def _fail(self, d: Driven, param: str, code: str, *messages: str) -> bool:
        data = [{"code": code, "message": m, "param": param, "line": lines.line_of(m)}
                for m in messages]
        errors = json.dumps({"object": "list", "data": data})
        if not await self.batches.transition(d.batch_id, "validating", "failed", errors=errors):
            return False  # cancelled meanwhile: the next step ends it as cancelled
        log.info("batch %s: failed: %s", d.batch_id, messages[0])
        return True

    async def _load(self, d: Driven, h: dict[str, str]) -> bool:
        """The batch's input and its lines' progress, once per driver; False when the batch
        has no input (cancelled while validating, or its copy is gone): it is ended now."""
        if not await self._read_input(d, h):
            if h["status"] == "cancelling":
                await self.batches.transition(d.batch_id, "cancelling", "cancelled")
            else:
                await self.batches.transition(
                    d.batch_id, ("in_progress", "finalizing"), "failed",
                    errors=lines.validation_errors("input_file_id", "file_not_found",
                                   "the batch's copy of its input is gone"))
            return False
        return True

    async def _read_input(self, d: Driven, h: dict[str, str]) -> bool:
        """Find the batch's input copy and read its lines' progress (and the text of its
        pending lines), once per driver; False when there is no copy to read."""
        if d.input is not None:
            return True
        key, index_key = h.get("input_key"), h.get("index_key")
        if not key:
            return False
        try:
            if not index_key:  # copied by a driver that kept no index: made now, once
                index_key = input_index_key(d.batch_id, _owner(h), int(h["created_at"]))
                checker = await self._check(await self.blobs.open(key))
                with contextlib.suppress(InvalidInput):  # checked once already: the index
                    checker.close()
                await self.blobs.put(index_key, checker.index())
                await self.batches.set_fields(d.batch_id, index_key=index_key)
            source = BatchInput(self.blobs, key, index_key)
            await source.probe()
            d.pending, d.done = await self.batches.progress(d.batch_id)
            d.raw = await source.read(d.pending)
        except BlobNotFound:
            return False
        d.input = source
        d.content, d.spans = b"", Window(int(h["total"]))
        d.jobs = set(d.pending.values())
        d.next = 0
        self._advance(d)
        return True

    def _next_lines(self, d: Driven) -> list[int]:
        """The lines `_submit` takes next: the first from `d.next` neither pending nor done, as
        many as there is room in flight for. `_read_window` reads the same ones."""
        room = self.settings.batch_max_in_flight - len(d.pending)
        todo: list[int] = []
        i = d.next
        while len(todo) < room and i < len(d.spans):
            if i not in d.pending and i not in d.done:
                todo.append(i)
            i += 1
        return todo

    async def _read_window(self, d: Driven) -> None:
        """Read the lines `_submit` takes next (the first lines from `d.next` neither pending
        nor done, as many as there is room in flight for) into the window."""
        assert d.input is not None
        if time.time() < d.backoff_until:
            return
        todo = self._next_lines(d)
        if any(i not in d.spans for i in todo):
            d.content, d.spans = window(len(d.spans), await d.input.read(todo))

    def _advance(self, d: Driven) -> None:
        while d.next < len(d.spans) and (d.next in d.pending or d.next in d.done):
            d.next += 1

    # In progress ------------------------------------------------------------------------------

    async def _poll(self, d: Driven) -> None:
        """Settle the lines whose jobs are final: one pipelined read of their statuses."""
        if not d.pending:
            return
        items = list(d.pending.items())
        async with self.store.redis.pipeline(transaction=False) as pipe:
            for _i, job_id in items:
                pipe.hget(names.job_key(job_id), "status")
            statuses = await pipe.execute()
        for (i, job_id), status in zip(items, statuses, strict=True):
            if status is None or JobStatus(status.decode()).final:
                await self._settle(d, i, job_id)

    async def _settle(self, d: Driven, i: int, job_id: str,
                      stopped: tuple[str, str] | None = None) -> None:
        """Record the file line of a line whose job is final (or gone)."""
        line = jsonl.parse(await self._raw(d, i))
        try:
            rec = await self.store.get(job_id)
        except JobNotFound:
            ok, entry = False, lines.error_line(
                d.batch_id, line, "job_expired",
                f"job {job_id} ended and its record expired before the batch read it",
                request_id=job_id)
        else:
            ok, entry = self._answer(d.batch_id, line, rec, stopped)
        await self.batches.record_line(d.batch_id, self.me, i, ok, entry)
        d.settled(i)

    def _answer(self, batch_id: str, line: jsonl.Line, rec: JobRecord,
                stopped: tuple[str, str] | None) -> tuple[bool, dict[str, Any]]:
        if rec.status == JobStatus.SUCCEEDED:
            try:
                req = translate.parse(line.url, line.body)
                if isinstance(req, ImageGenerationRequest):  # the check lets text lines only
                    raise InvalidInput("url", f"{line.url} is not a batch endpoint")
                body = translate.text_response(req, rec)
            except InvalidInput as exc:  # the line no longer parses (a newer server)
                status, body = openai_error(exc, 400, line.url)
                return False, lines.response_line(batch_id, line, status, body, rec.id)
            return True, lines.response_line(batch_id, line, 200, body, rec.id)
        if stopped is not None and rec.status == JobStatus.CANCELED:
            return False, lines.error_line(batch_id, line, *stopped, request_id=rec.id)
        status, body = translate.failure(rec)
        return False, lines.response_line(batch_id, line, status, body, rec.id)

    async def _submit(self, d: Driven, h: dict[str, str]) -> None:
        """Submit lines until `batch_max_in_flight` of them are unfinished."""
        if time.time() < d.backoff_until:
            return
        todo = self._next_lines(d)
        principal = Principal(key_id=_owner(h))
        for start in range(0, len(todo), SUBMIT_CONCURRENCY):
            chunk = todo[start:start + SUBMIT_CONCURRENCY]
            results = await asyncio.gather(
                *(self._submit_line(d, i, principal) for i in chunk), return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException):
                    raise r
            self._advance(d)
            if time.time() < d.backoff_until:
                break

    async def _submit_line(self, d: Driven, i: int, principal: Principal) -> None:
        assert d.content is not None
        line = jsonl.read(d.content, d.spans[i])
        try:
            req = translate.parse(line.url, line.body)
            job = translate.job_request(req, self.registry)
            done = await self.submissions.submit(
                job, principal, idempotency_key=f"batch-{d.batch_id}-{line.line}", base_url=None)
        except InvalidInput as exc:
            status, body = openai_error(exc, 400, line.url)
            await self.batches.record_line(d.batch_id, self.me, i, False,
                                           lines.response_line(d.batch_id, line, status, body))
            d.done.add(i)
            return
        except IdempotencyConflict as exc:  # only if this line's job was made otherwise
            await self.batches.record_line(
                d.batch_id, self.me, i, False,
                lines.response_line(d.batch_id, line, 409, error_body(str(exc), code=exc.code)))
            d.done.add(i)
            return
        except (ServiceUnavailable, RateLimited) as exc:
            # Queue full or the like: try the line again later; never drop it.
            wait = max(1.0, float(exc.retry_after))
            d.backoff_until = max(d.backoff_until, time.time() + wait)
            log.info("batch %s: submitting put off %.0fs: %s", d.batch_id, wait, exc)
            return
        await self.batches.record_job(d.batch_id, self.me, i, done.job.id)
        d.submitted(i, done.job.id)

    # Ending -----------------------------------------------------------------------------------

    async def _expire(self, d: Driven, h: dict[str, str], status: str) -> None:
        """Past its window, decided before anything of the batch runs or is read: a batch
        still validating ends with no lines (its input is never read); one in progress is
        stopped as a cancel would, its input read only to name each unfinished line in the
        error file (every custom_id in exactly one file). When its copy is gone, its lines'
        jobs are canceled and its files hold the lines that were done."""
        if status != "validating" and await self._read_input(d, h):
            await self._stop(d, h, EXPIRED)
        else:
            pending, _done = await self.batches.progress(d.batch_id)
            for job_id in pending.values():
                await self._cancel_job(job_id)
        await self._finish(d, h, status, "expired")

    async def _cancel_job(self, job_id: str) -> None:
        with contextlib.suppress(JobNotFound):
            rec = await self.store.get(job_id)
            if not rec.final:
                await self.lifecycle.cancel(rec)

    async def _raw(self, d: Driven, i: int) -> jsonl.Raw:
        """A pending line's text: kept since it was submitted, or read (taken over)."""
        if i not in d.raw:
            assert d.input is not None
            d.raw.update(await d.input.read([i]))
        return d.raw[i]

    async def _stop(self, d: Driven, h: dict[str, str], why: tuple[str, str]) -> None:
        """Cancelled or expired: no more lines are submitted, the unfinished jobs are canceled,
        and every line not done goes to the error file with `why` (code, message), read a
        window at a time."""
        for i, job_id in list(d.pending.items()):
            await self._cancel_job(job_id)
            await self._settle(d, i, job_id, stopped=why)
        assert d.input is not None
        source = d.input

        async def unrun(i: int, raw: jsonl.Raw) -> None:
            await self.batches.record_line(d.batch_id, self.me, i, False,
                                           lines.error_line(d.batch_id, jsonl.parse(raw), *why))
            d.done.add(i)

        start = 0
        while start < len(d.spans):
            left = [i for i in range(start, min(start + WINDOW_LINES, len(d.spans)))
                    if i not in d.done]
            start += WINDOW_LINES
            raws = await source.read(left)
            for k in range(0, len(left), SUBMIT_CONCURRENCY):
                await asyncio.gather(*(unrun(i, raws[i])
                                       for i in left[k:k + SUBMIT_CONCURRENCY]))
            await self._flush(d, h)

    async def _flush(self, d: Driven, h: dict[str, str], now: bool = False) -> None:
        """Write the finished lines Redis holds to a new part in the blob store and let Redis
        drop them: when `flush_lines` of them wait, when the oldest waited `flush_seconds`,
        or `now`."""
        waiting = await self.batches.unflushed(d.batch_id)
        if not waiting:
            d.unflushed_since = None
            return
        clock = time.monotonic()
        if d.unflushed_since is None:
            d.unflushed_since = clock
        if not now and waiting < self.flush_lines and \
                clock - d.unflushed_since < self.flush_seconds:
            return
        finished = await self.batches.finished_lines(d.batch_id)
        key = parts.part_key(d.batch_id, _owner(h), int(h["created_at"]))
        await self.blobs.put(key, parts.encode(finished), "text/plain")
        await self.batches.flushed(d.batch_id, self.me, key, list(finished))
        d.unflushed_since = None

    async def _finish(self, d: Driven, h: dict[str, str], from_: str, to: str) -> bool:
        """Write the output file (and the error file, when a line failed) from the batch's
        parts and end the batch `to`; False when its status had moved on from `from_` (the
        next step goes on). The next step sends its webhook and retires it."""
        out_id = await self.batches.set_if_absent(d.batch_id, "planned_output_id",
                                                  new_file_id())
        err_id = await self.batches.set_if_absent(d.batch_id, "planned_error_id",
                                                  new_file_id())
        await self._flush(d, h, now=True)
        made = await parts.assemble(self.blobs, await self.batches.parts(d.batch_id))
        try:
            owner = _owner(h)
            await self.files.create_file(made.output, f"{d.batch_id}_output.jsonl",
                                         BATCH_OUTPUT, owner, file_id=out_id)
            fields = {"output_file_id": out_id}
            if made.failures:
                await self.files.create_file(made.errors, f"{d.batch_id}_error.jsonl",
                                             BATCH_OUTPUT, owner, file_id=err_id)
                fields["error_file_id"] = err_id
        finally:
            made.close()
        if not await self.batches.transition(d.batch_id, from_, to, **fields):
            return False
        log.info("batch %s: %s (%d succeeded, %d failed)", d.batch_id, to, made.outputs,
                 made.failures)
        return True


def batch_driver(state: Any, settings: Settings, consumer: str) -> BatchDriver:
    """The driver of an app whose lifespan has set up its state (services/api/app.py)."""
    from services.api.batches.deps import batch_store, file_store

    parts = DriverParts(batch_store(state, settings), file_store(state, settings), state.blobs,
                        state.store, state.submissions, state.lifecycle, state.registry,
                        hub=state.hub)
    return BatchDriver(parts, settings, consumer)
