"""A sub-request's spans on its worker, in its job's trace (shared/tracing.py).

Made only for a sub-request that carries a traceparent, on a worker that traces, of a job that
was sampled (or under a sampler that does not follow the parent): `open` returns None
otherwise, and the handler's only cost is that check. Each span is recorded from times
the handler reads anyway, once what it covers is over, so nothing is added on the device
thread or between decode steps:

    fibermill.queue       its wait in the queue: sent (the message's `sent_at`) to taken
    fibermill.lease       this worker's hold on it: the lease taken, run, stored (how long,
                          and whether that made its job final), released; attempt, outcome
      fibermill.batch     its device steps in aggregate, in the batch it started in: from that
                          batch's start on the device to its result (the gap before it, from
                          the lease's start, is its wait for room in the engine); the batch
                          size, the steps, and links to the sub-requests that started with it:
                          the first of them (the batch's leader) links to every other's lease
                          span, the others to the leader's, so a batch of n costs 2(n-1)
                          links, not n(n-1)
      fibermill.blob_write  an image's PNG to the blob store

Three spans a sub-request, their attributes few: encoding a span for export costs the worker
more than making it (docs/architecture.md, "Tracing").
"""

import time

from opentelemetry.trace import Link, SpanContext, StatusCode
from opentelemetry.util.types import AttributeValue

from shared import tracing
from shared.messages import Outcome, SubRequest

# The outcomes that are a failure of the sub-request, not a skip of a duplicate delivery.
_FAILED = {Outcome.FAILED, Outcome.TIME_LIMIT}


def linked(member: str, together: list[str]) -> list[str]:
    """Whom `member`'s batch span links to, of the sub-requests that started together: the
    first of them (the batch's leader) links to every other, each other to the leader."""
    if not together:
        return []
    leader = together[0]
    return together[1:] if member == leader else [leader]


class SubRequestSpans:
    def __init__(self, sub: SubRequest, parent: SpanContext, worker: str,
                 received: float) -> None:
        if sub.sent_at is not None:
            tracing.record("fibermill.queue", parent, sub.sent_at, received,
                           {"fibermill.index": sub.index})
        # The job's id and model are its submit span's, the parent of both.
        self.lease = tracing.start("fibermill.lease", parent, received,
                                   {"fibermill.job_id": sub.job_id,
                                    "fibermill.index": sub.index, "fibermill.worker": worker})
        self.links: list[Link] = []
        self.ending: dict[str, AttributeValue] = {}

    @classmethod
    def open(cls, sub: SubRequest, worker: str) -> "SubRequestSpans | None":
        """Its spans, or None: tracing off, a job stored without tracing, or a job not sampled
        (under the default parent-based sampler none of its spans would be exported)."""
        if not tracing.enabled() or sub.traceparent is None:
            return None
        parent = tracing.span_context_of(sub.traceparent)
        if not tracing.may_sample(parent):
            return None
        assert parent is not None
        return cls(sub, parent, worker, time.time())

    def started_with(self, peers: list["SubRequestSpans"]) -> None:
        """The sub-requests its batch started with that it links to (`linked`), linked from
        its batch span."""
        self.links = [link for p in peers if (link := tracing.link_to(p.lease)) is not None]

    def ran(self, submitted: float, run_started: float | None, finished: float,
            batch_size: int, steps: int) -> None:
        tracing.record("fibermill.batch", self.lease,
                       submitted if run_started is None else run_started, finished,
                       {"fibermill.batch.size": batch_size, "fibermill.steps": steps},
                       self.links)

    def blob_written(self, start: float, end: float) -> None:
        tracing.record("fibermill.blob_write", self.lease, start, end)

    def stored(self, start: float, end: float, final: bool) -> None:
        # On the lease span, which ends right after: a span of its own cost as much as the
        # rest of a sub-request's spans' share (docs/architecture.md, "Tracing").
        self.ending = {"fibermill.store_ms": round((end - start) * 1000, 3),
                       "fibermill.job_final": final}

    def close(self, outcome: Outcome, attempt: int) -> None:
        if self.lease is None:
            return
        if outcome in _FAILED:
            self.lease.set_status(StatusCode.ERROR, outcome.value)
        tracing.end(self.lease, attributes={**self.ending, "fibermill.outcome": outcome.value,
                                            "fibermill.attempt": attempt})
