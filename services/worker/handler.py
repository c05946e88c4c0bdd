"""Run one sub-request: take its lease, run the model, store the result once and release the
lease in the same step (or release it alone when nothing is stored). A one-prompt text job
becomes final in that step too (JobStore.store_last_result)."""

import logging
import time

from services.worker import metrics
from services.worker.drain import Drainer
from services.worker.engine.device_faults import DeviceLost, OutOfDeviceMemory
from services.worker.engine.engine import Arrival, Engine
from services.worker.engine.results import ImageResult, TextResult
from services.worker.engine.scheduling import Ticket
from services.worker.engine.start import OnBatch
from services.worker.engine.stopped import PipelineStopped
from services.worker.flights import Flights, InFlight
from services.worker.outputs import OutputWriter
from services.worker.progress import ProgressPublisher
from services.worker.spans import SubRequestSpans, linked
from shared.errors import BlobStoreUnavailable, InvalidInput, ModelError
from shared.failures import dead_lettered, time_limit_exceeded
from shared.inputs import TextOutput
from shared.job import JobStatus
from shared.job_metrics import observe_final
from shared.jobstore import Finished, JobStore, LeaseGrant
from shared.messages import (
    GeneratedImage,
    GeneratedText,
    JobError,
    LeaseOutcome,
    Outcome,
    StopReason,
    SubRequest,
    SubResult,
)
from shared.settings import Settings

log = logging.getLogger(__name__)


Generated = tuple[GeneratedText | GeneratedImage, bytes | None]


def _generated(result: TextResult | ImageResult) -> Generated:
    """The sub-result's output, and the bytes stored beside it (an image's PNG)."""
    if isinstance(result, ImageResult):
        image = GeneratedImage(seed=result.seed, width=result.width, height=result.height)
        return image, result.png
    text = GeneratedText(text=result.text, finish_reason=result.finish_reason,
                         tokens=result.tokens, prompt_tokens=result.prompt_tokens,
                         logprobs=result.logprobs)
    return text, None


class Handler:
    def __init__(self, settings: Settings, worker_id: str, store: JobStore,
                 engines: dict[str, Engine], flights: Flights, drainer: Drainer,
                 progress: ProgressPublisher, outputs: OutputWriter) -> None:
        self.settings = settings
        self.outputs = outputs
        self.worker_id = worker_id
        self.store = store
        self.engines = engines
        self.flights = flights
        self.drainer = drainer
        self.progress = progress

    async def handle(self, sub: SubRequest) -> Outcome:
        spans = SubRequestSpans.open(sub, self.worker_id)  # None unless traced
        grant = LeaseGrant(LeaseOutcome.GONE)
        # Announced before the lease round trip, so the batcher waits for this sub-request
        # (briefly) instead of starting a batch without it.
        try:
            with self.engines[sub.model].arrival() as arrival:
                grant = await self.store.acquire_lease(
                    sub, self.worker_id, self.settings.lease_seconds, self.settings.max_attempts,
                    # One that joins the engine's next iteration is charged its attempt with
                    # its lease, so no round trip stands between the device and it
                    # (engine/start.py).
                    charge=not sub.isolated and arrival.starts_soon())
                outcome = await self._handle(sub, arrival, grant, spans)
        except BaseException:
            if spans is not None:
                spans.close(Outcome.FAILED, grant.attempt)
            raise
        if spans is not None:
            spans.close(outcome, grant.attempt)
        metrics.SUBREQUESTS.labels(sub.model, outcome).inc()
        return outcome

    async def _handle(self, sub: SubRequest, arrival: Arrival, grant: LeaseGrant,
                      spans: SubRequestSpans | None) -> Outcome:
        if grant.outcome != LeaseOutcome.ACQUIRED:
            return await self._not_run(sub, grant)
        flight = InFlight(sub, time.time() + self.settings.subrequest_time_limit_seconds)
        flight.watched = grant.watched
        flight.charged = grant.charged
        flight.spans = spans
        self.flights.add(flight)
        if self.drainer.expired:  # taken after the drain deadline: straight back to the queue
            flight.request_stop(StopReason.DRAIN)
        stored = False
        try:
            outcome, stored = await self._run(flight, arrival)
            return outcome
        finally:
            self.flights.remove(sub.member)
            if not stored:  # store_result.lua releases the lease it stores under
                await self.store.release_lease(sub.member, self.worker_id)

    async def started(self, members: list[str]) -> None:
        """The engine's `on_start`: these sub-requests start on the device now."""
        await self.store.charge_attempts(members, self.worker_id)
        for member in members:
            flight = self.flights.get(member)
            if flight is not None:
                flight.charged = True

    async def _not_run(self, sub: SubRequest, grant: LeaseGrant) -> Outcome:
        """done, final, gone or busy: another delivery already covers this sub-request;
        exhausted: this one is given up."""
        if grant.outcome == LeaseOutcome.EXHAUSTED:
            attempts = self.settings.max_attempts
            await self.store.dead_letter(sub, dead_lettered(sub, attempts, self.worker_id),
                                         attempts=attempts, keep=self.settings.dead_letter_max)
        return Outcome(grant.outcome.value)

    async def _run(self, flight: InFlight, arrival: Arrival) -> tuple[Outcome, bool]:
        """The outcome, and whether a result was stored (which released the lease)."""
        sub = flight.sub
        result = SubResult(index=sub.index, worker=self.worker_id, started_at=flight.started)
        blob = None
        t0 = time.perf_counter()
        submitted = time.time()
        on_text = self.progress.text_hook(flight)
        # A stop while it still waits in the engine's queue withdraws it at once: it never
        # reaches the device, and its slot or batch place goes to the next one.
        flight.on_stop = arrival.engine.poke
        try:
            made = await arrival.submit(sub.item, Ticket(
                should_stop=self.progress.hook(flight), withdrawn=flight.stop.is_set,
                tag=sub.member, isolate=sub.isolated, on_text=on_text, charged=flight.charged,
                cache_scope=self._cache_scope(sub), on_batch=self._on_batch(flight)))
            if flight.spans is not None:
                flight.spans.ran(submitted, flight.run_started_at, time.time(),
                                 flight.batch_size, flight.steps)
            # Its output events go out before the result that may make the job final; the
            # final one goes out with the result, in the same script.
            await on_text.flushed()
            result.output, blob = _generated(made)
            outcome = Outcome.SUCCEEDED
        except DeviceLost:
            return await self._device_lost(flight), False
        except PipelineStopped:
            outcome = await self._stopped(flight)
            if outcome != Outcome.TIME_LIMIT:
                return outcome, False
            result = time_limit_exceeded(sub, self.settings.subrequest_time_limit_seconds,
                                         self.worker_id, flight.started)
        except Exception as exc:  # a failing model fails its own sub-request, not the worker
            log.exception("sub-request %s failed", sub.member)
            # An input the model refuses (a prompt past its context), or one too large for
            # the device even alone, keeps its own code.
            code = (exc.code if isinstance(exc, InvalidInput | OutOfDeviceMemory)
                    else ModelError.code)
            result.error = JobError(code=code, message=f"{type(exc).__name__}: {exc}")
            outcome = Outcome.FAILED
        if blob is not None:
            writing = time.time()
            try:
                result.blob = await self.outputs.write(sub, blob)
            except BlobStoreUnavailable as exc:
                log.error("sub-request %s: output not stored: %s", sub.member, exc)
                result.output = None
                result.error = JobError(code=exc.code, message=str(exc))
                outcome = Outcome.FAILED
            if flight.spans is not None:
                flight.spans.blob_written(writing, time.time())
        metrics.PHASE_SECONDS.labels(sub.model, "subrequest").observe(time.perf_counter() - t0)
        result.finished_at = time.time()
        result.run_started_at = flight.run_started_at
        event = on_text.final if outcome == Outcome.SUCCEEDED else None
        storing = result.finished_at
        stored = await self._store(sub, result, outcome, event)
        if flight.spans is not None:
            flight.spans.stored(storing, time.time(), isinstance(stored, Finished))
        if isinstance(stored, Finished):
            return outcome, True
        if stored != 1:
            return Outcome.DUPLICATE, True
        return outcome, True

    async def _store(self, sub: SubRequest, result: SubResult, outcome: Outcome,
                     event: str | None) -> int | Finished:
        if outcome == Outcome.SUCCEEDED and isinstance(result.output, GeneratedText):
            # A text's output is its own (an image's links are the API's to make): a job of
            # this one prompt is made final in the step that stores it, with no joiner.
            output = TextOutput.of(result.output, result.worker).model_dump(mode="json")
            stored = await self.store.store_last_result(sub.job_id, result, output,
                                                        model=sub.model, event=event)
            if isinstance(stored, Finished):
                observe_final(stored.task, sub.model, JobStatus.SUCCEEDED.value,
                              stored.created_at, stored.started_at, stored.completed_at)
            return stored
        return await self.store.store_result(sub.job_id, result, model=sub.model, event=event)

    def _on_batch(self, flight: InFlight) -> OnBatch:
        """The engine's word that the flight's batch starts on the device: its start for the
        timeline, and, traced, the links to the sub-requests starting with it."""

        def started(together: list[str], size: int) -> None:
            first = flight.run_started_at is None  # not a rerun alone, nor a row readmitted
            flight.batch_started(size)
            if flight.spans is None or not first:
                return
            peers = []
            for member in linked(flight.sub.member, together):
                other = self.flights.get(member)
                if other is not None and other.spans is not None:
                    peers.append(other.spans)
            flight.spans.started_with(peers)

        return started

    def _cache_scope(self, sub: SubRequest) -> str:
        """Who its cached prompt pages are shared with: its API key's other sub-requests, or
        (`global`) every one."""
        return sub.owner or "" if self.settings.prefix_cache_scope == "key" else ""

    async def _device_lost(self, flight: InFlight) -> Outcome:
        """The device failed for good under it: back to its queue, and the worker exits
        (drain.py). Its attempt stays charged, as a lost worker's would: a sub-request that
        breaks the device every time is dead-lettered after `max_attempts`."""
        self.drainer.device_lost()
        flight.charged = False  # so the hand-back keeps its attempt charged
        how = await self.drainer.hand_back(flight)
        log.error("the device failed under %s; handed it back (%s)", flight.sub.member, how)
        return Outcome.HANDED_BACK

    async def _stopped(self, flight: InFlight) -> Outcome:
        """A sub-request stopped at a step boundary: say why, and hand it back at a drain."""
        if flight.stop_requested_at_step is not None:
            metrics.STEPS_AFTER_STOP.labels(flight.sub.model).observe(
                flight.steps - flight.stop_requested_at_step)
        if flight.stop_reason == StopReason.CANCELED:
            return Outcome.CANCELED  # the job is final already: nothing to store
        if flight.stop_reason == StopReason.DRAIN:
            # Back to the queue for another worker, its attempt given back. The lease release
            # that follows is a no-op: the hand-back renamed its owner.
            how = await self.drainer.hand_back(flight)
            log.info("handed %s back (%s)", flight.sub.member, how)
            return Outcome.HANDED_BACK
        return Outcome.TIME_LIMIT
