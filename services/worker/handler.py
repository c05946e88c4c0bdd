"""Run one sub-request: take its lease, run the model, store the result once, release."""

import logging
import time

from services.worker import metrics
from services.worker.drain import hand_back
from services.worker.engine.engine import Arrival
from services.worker.pipelines.base import ImageResult, TextResult
from services.worker.pipelines.stopped import PipelineStopped
from services.worker.progress import step_hook
from services.worker.runtime import InFlight, WorkerRuntime
from shared.errors import DeadLettered, ModelError, TimeLimitExceeded
from shared.job import JobError
from shared.subrequest import SubRequest, SubResult

log = logging.getLogger(__name__)


def _output(result: TextResult | ImageResult) -> tuple[dict, bytes | None]:
    if isinstance(result, ImageResult):
        return {"seed": result.seed, "width": result.width, "height": result.height}, result.png
    return {
        "text": result.text,
        "finish_reason": result.finish_reason,
        "tokens": result.tokens,
    }, None


async def handle(rt: WorkerRuntime, sub: SubRequest) -> str:
    # Announced before the lease round trip, so the batcher waits for this sub-request
    # (briefly) instead of starting a batch without it.
    with rt.engines[sub.model].arrival() as arrival:
        return await _handle(rt, sub, arrival)


async def _handle(rt: WorkerRuntime, sub: SubRequest, arrival: Arrival) -> str:
    store, settings = rt.store, rt.settings
    grant = await store.acquire_lease(sub, rt.id, settings.lease_seconds, settings.max_attempts)
    if grant.outcome == "exhausted":
        reason = (
            f"sub-request {sub.index} was given up after {settings.max_attempts} attempts: "
            "each one lost its worker (crash, out of memory or kill)"
        )
        await store.dead_letter(sub, reason)
        await store.store_result(
            sub.job_id,
            SubResult(
                index=sub.index,
                worker=rt.id,
                finished_at=time.time(),
                error=JobError(code=DeadLettered.code, message=reason),
            ),
        )
    if grant.outcome != "acquired":
        # done, final, gone or busy: another delivery already covers this sub-request.
        metrics.SUBREQUESTS.labels(sub.model, grant.outcome).inc()
        return grant.outcome

    flight = InFlight(sub, time.time() + settings.subrequest_time_limit_seconds)
    rt.in_flight[sub.member] = flight
    if rt.drain_expired:  # taken after the drain deadline: straight back to the queue
        flight.request_stop("drain")
    metrics.IN_FLIGHT.set(len(rt.in_flight))
    try:
        result = SubResult(index=sub.index, worker=rt.id, started_at=flight.started)
        blob = None
        t0 = time.perf_counter()
        try:
            out = await arrival.submit(sub.item, step_hook(rt, flight))
            result.output, blob = _output(out)
            outcome = "succeeded"
        except PipelineStopped:
            if flight.stop_requested_at_step is not None:
                metrics.STEPS_AFTER_STOP.labels(sub.model).observe(
                    flight.steps - flight.stop_requested_at_step)
            if flight.stop_reason == "canceled":
                # The job is already final: nothing to store, the lease is released below.
                metrics.SUBREQUESTS.labels(sub.model, "canceled").inc()
                return "canceled"
            if flight.stop_reason == "drain":
                # The worker is shutting down: back to the queue for another worker, the
                # attempt given back (services/worker/drain.py). The release below is a no-op.
                how = await hand_back(rt, sub)
                log.info("handed %s back (%s)", sub.member, how)
                metrics.SUBREQUESTS.labels(sub.model, "handed_back").inc()
                return "handed_back"
            limit = settings.subrequest_time_limit_seconds
            result.error = JobError(
                code=TimeLimitExceeded.code,
                message=f"sub-request {sub.index} ran past its {limit}s limit",
            )
            outcome = "time_limit"
        except Exception as exc:  # a failing model fails its own sub-request, not the worker
            log.exception("sub-request %s failed", sub.member)
            result.error = JobError(code=ModelError.code, message=f"{type(exc).__name__}: {exc}")
            outcome = "failed"
        metrics.PHASE_SECONDS.labels(sub.model, "subrequest").observe(time.perf_counter() - t0)
        result.finished_at = time.time()
        written = await store.store_result(sub.job_id, result, blob)
        if written != 1:
            outcome = "duplicate"
        metrics.SUBREQUESTS.labels(sub.model, outcome).inc()
        return outcome
    finally:
        rt.in_flight.pop(sub.member, None)
        metrics.IN_FLIGHT.set(len(rt.in_flight))
        await store.release_lease(sub.member, rt.id)
