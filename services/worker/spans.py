"""A sub-request's spans on its worker, in its job's trace (shared/tracing.py).

Made only for a sub-request that carries a traceparent, on a worker that traces: `open` returns
None otherwise, and the handler's only cost is that check. Each span is recorded from times
the handler reads anyway, once what it covers is over, so nothing is added on the device
thread or between decode steps:

    fibermill.queue       its wait in the queue: sent (the message's `sent_at`) to taken
    fibermill.lease       this worker's hold on it: the lease taken, run, stored, released
      fibermill.batch     from its submission to the engine to its result; the batch size, and
                          links to the lease spans of the sub-requests that started with it
        fibermill.device  its device steps in aggregate: from its batch's start to its result
      fibermill.blob_write  an image's PNG to the blob store
      fibermill.store     its result stored (and a one-prompt text job made final)
"""

import time

from opentelemetry.trace import Link, StatusCode
from opentelemetry.util.types import AttributeValue

from shared import tracing
from shared.messages import Outcome, SubRequest

# The outcomes that are a failure of the sub-request, not a skip of a duplicate delivery.
_FAILED = {Outcome.FAILED, Outcome.TIME_LIMIT}


class SubRequestSpans:
    def __init__(self, sub: SubRequest, worker: str, received: float) -> None:
        self.sub = sub
        self.attributes: dict[str, AttributeValue] = {
            "fibermill.job_id": sub.job_id, "fibermill.index": sub.index,
            "fibermill.model": sub.model}
        if sub.sent_at is not None:
            tracing.record("fibermill.queue", sub.traceparent, sub.sent_at, received,
                           self.attributes)
        self.lease = tracing.start("fibermill.lease", sub.traceparent, received,
                                   {**self.attributes, "fibermill.worker": worker})
        self.links: list[Link] = []

    @classmethod
    def open(cls, sub: SubRequest, worker: str) -> "SubRequestSpans | None":
        if not tracing.enabled() or sub.traceparent is None:
            return None
        return cls(sub, worker, time.time())

    def started_with(self, peers: list["SubRequestSpans"]) -> None:
        """The other sub-requests its batch started with, linked from its batch span."""
        self.links = [link for p in peers if (link := tracing.link_to(p.lease)) is not None]

    def ran(self, submitted: float, run_started: float | None, finished: float,
            batch_size: int, steps: int) -> None:
        batch = tracing.record("fibermill.batch", self.lease, submitted, finished,
                               {**self.attributes, "fibermill.batch.size": batch_size},
                               self.links)
        if run_started is not None:
            tracing.record("fibermill.device", batch, run_started, finished,
                           {**self.attributes, "fibermill.steps": steps})

    def blob_written(self, start: float, end: float) -> None:
        tracing.record("fibermill.blob_write", self.lease, start, end, self.attributes)

    def stored(self, start: float, end: float, final: bool) -> None:
        tracing.record("fibermill.store", self.lease, start, end,
                       {**self.attributes, "fibermill.job_final": final})

    def close(self, outcome: Outcome, attempt: int) -> None:
        if self.lease is None:
            return
        if outcome in _FAILED:
            self.lease.set_status(StatusCode.ERROR, outcome.value)
        tracing.end(self.lease, attributes={"fibermill.outcome": outcome.value,
                                            "fibermill.attempt": attempt})
