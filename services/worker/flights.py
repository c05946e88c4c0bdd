"""The sub-requests a worker process holds right now, for lease renewal, cancellation, time
limits and the drain."""

import threading
import time
from collections.abc import Callable, Iterator

from services.worker import metrics
from services.worker.spans import SubRequestSpans
from shared.messages import StopReason, SubRequest


class InFlight:
    """One held sub-request and how to stop it at its next denoise or decode step."""

    def __init__(self, sub: SubRequest, deadline: float) -> None:
        self.sub = sub
        self.started = time.time()
        self.deadline = deadline
        self.stop = threading.Event()  # read by the pipeline on the device thread
        self.stop_reason: StopReason | None = None
        self.steps = 0  # step boundaries passed so far
        self.charged = False  # an attempt was charged: it started on the device, or soon will
        self.stop_requested_at_step: int | None = None
        self.on_stop: Callable[[], None] | None = None  # e.g. withdraw it from a queue
        # A live stream watches its job: its step and output events are wanted (read on the
        # device thread; set on the runtime's loop when a stream opens).
        self.watched = True
        # Its first batch on the device: when it began and how many rows it had (the job's
        # timeline and trace; engine/start.py).
        self.run_started_at: float | None = None
        self.batch_size = 0
        self.spans: SubRequestSpans | None = None  # with tracing on (spans.py)

    def batch_started(self, size: int) -> None:
        if self.run_started_at is None:  # a row preempted and admitted again keeps its first
            self.run_started_at = time.time()
            self.batch_size = size

    def request_stop(self, reason: StopReason) -> None:
        if not self.stop.is_set():
            self.stop_reason = reason
            self.stop_requested_at_step = self.steps
            self.stop.set()
            if self.on_stop is not None:
                self.on_stop()


class Flights:
    """Held sub-requests by member (`job:index`). Touched only on the runtime's event loop."""

    def __init__(self) -> None:
        self._by_member: dict[str, InFlight] = {}

    def add(self, flight: InFlight) -> None:
        self._by_member[flight.sub.member] = flight
        metrics.IN_FLIGHT.set(len(self._by_member))

    def remove(self, member: str) -> InFlight | None:
        flight = self._by_member.pop(member, None)
        metrics.IN_FLIGHT.set(len(self._by_member))
        return flight

    def get(self, member: str) -> InFlight | None:
        return self._by_member.get(member)

    def __len__(self) -> int:
        return len(self._by_member)

    def __contains__(self, member: str) -> bool:
        return member in self._by_member

    def __iter__(self) -> Iterator[InFlight]:
        return iter(list(self._by_member.values()))  # a copy: callers await while iterating

    def members(self) -> list[str]:
        return list(self._by_member)

    def job_ids(self) -> list[str]:
        return sorted({f.sub.job_id for f in self._by_member.values()})

    def of_job(self, job_id: str) -> list[InFlight]:
        return [f for f in self._by_member.values() if f.sub.job_id == job_id]

    def stop_job(self, job_id: str, reason: StopReason = StopReason.CANCELED) -> int:
        """Ask every held sub-request of `job_id` to stop; returns how many."""
        flights = self.of_job(job_id)
        for f in flights:
            f.request_stop(reason)
        return len(flights)

    def watch_job(self, job_id: str) -> int:
        """A live stream began to watch `job_id`: its held sub-requests publish their events
        from now on. Returns how many."""
        flights = self.of_job(job_id)
        for f in flights:
            f.watched = True
        return len(flights)

    def stop_all(self, reason: StopReason) -> int:
        for f in self._by_member.values():
            f.request_stop(reason)
        return len(self._by_member)
