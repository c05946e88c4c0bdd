"""The dynamic batcher: groups compatible sub-requests into batches for one model (images); a
`Scheduling` (scheduling.py).

Items with the same batch key (same shapes: size, steps and whether guided) are batched up to
`max_batch`. A full group is dispatched at once, whatever key the oldest item has, up to
`max_running` batches in the pipeline (one on the device while the next one's CPU phases run
beside it). An item withdrawn while queued (its sub-request was stopped) leaves at once with
PipelineStopped instead of waiting for a batch. A partial group is dispatched only when no
batch is running, and then at once when nothing else is on its way to the batcher (`expected`:
sub-requests this worker has taken from the queue but not yet submitted), else after at most
`max_wait` from its oldest item's arrival. So an idle engine never waits when nothing else is
queued, a busy one lets the next batch fill up while the device works, and a burst is caught
whole. An isolated item (its sub-request was on the device when a worker was lost) runs as a
batch of one with nothing beside it in the pipeline, so that if it kills its worker again it is
the only one to blame. Everything here runs on the event loop.

A burst reaches the worker one Celery message at a time, and its first sub-request is often
taken before anything else is announced: the API is still accepting the burst's other requests
(measured: 32 digits jobs posted at once reached the batcher over 90 ms, with gaps of 20 ms
after the first one to three). With `linger` (the registry's `linger_ms`, 0 by default), an
idle engine's partial group also waits while items keep coming, each arrival giving the next
one `linger` more, within `max_wait` from the oldest: Kafka's `linger.ms`, for models whose
batch takes long enough that a few milliseconds' wait for a fuller one is cheap.
"""

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from services.worker.engine.batch import Batch
from services.worker.engine.results import Result
from services.worker.engine.scheduling import PLAIN, Ticket
from services.worker.engine.start import OnBatch
from services.worker.engine.stopped import PipelineStopped

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Pending:
    item: Any
    key: Hashable
    should_stop: Callable[[], bool] | None
    future: asyncio.Future
    arrived: float = field(default_factory=time.monotonic)
    withdrawn: Callable[[], bool] | None = None  # checked while queued; never counts a step
    tag: str | None = None  # the sub-request it is (engine/start.py)
    isolate: bool = False  # runs alone, with nothing else in the pipeline beside it
    charged: bool = False
    on_batch: OnBatch | None = None

    @property
    def gone(self) -> bool:
        return self.future.done() or (self.withdrawn is not None and self.withdrawn())


def _one_key(item: Any) -> Hashable:
    return None


class Batcher:
    def __init__(
        self,
        run: Callable[[list[Pending]], Awaitable[None]],
        max_batch: int,
        max_wait_s: float,
        max_running: int = 2,
        linger_s: float = 0.0,
        key: Callable[[Any], Hashable] = _one_key,
        together: Callable[[Batch], Awaitable[list[Result]]] | None = None,
    ) -> None:
        """`run` runs a group and settles its futures; `key` says which items may share a
        batch; `together` runs a whole batch at once, outside the queue (`run_together`)."""
        self._run_batch = run
        self._key = key
        self._together = together
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.max_running = max_running
        self.linger_s = linger_s
        self.pending: deque[Pending] = deque()
        self.running = 0
        self.isolated_running = False
        self.expected = 0
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()

    def submit(self, item: Any, ticket: Ticket = PLAIN) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        key = self._key(item)
        if ticket.isolate:
            key = ("isolated", object())  # a group of its own
        self.pending.append(Pending(item, key, ticket.should_stop, future,
                                    withdrawn=ticket.withdrawn, tag=ticket.tag,
                                    isolate=ticket.isolate, charged=ticket.charged,
                                    on_batch=ticket.on_batch))
        self.pump()
        return future

    def starts_soon(self) -> bool:
        """Never: batches gather for a while and run whole, so no item is sure to start at the
        next iteration."""
        return False

    async def run_together(self, batch: Batch) -> list[Result]:
        if self._together is None:
            raise NotImplementedError("this batcher runs queued groups only")
        return await self._together(batch)

    def _withdraw(self) -> None:
        for p in [p for p in self.pending if p.gone]:
            self.pending.remove(p)
            if not p.future.done():
                p.future.set_exception(PipelineStopped())

    def _next_group(self) -> list[Pending]:
        """A full group if any key has one, else the oldest item's (partial) group."""
        by_key: dict[Hashable, list[Pending]] = {}
        for p in self.pending:
            group = by_key.setdefault(p.key, [])
            group.append(p)
            if len(group) == self.max_batch:
                return group
        return by_key[self.pending[0].key]

    def pump(self) -> None:
        """Dispatch every group that is ready, and wake up later for one that is not yet."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._withdraw()
        while self.running < self.max_running and self.pending and not self.isolated_running:
            group = self._next_group()
            if group[0].isolate and self.running:
                return  # alone on the device: pumped again when the running batch ends
            if len(group) < self.max_batch and not group[0].isolate:
                if self.running:
                    return  # grows while the device works; pumped again when a batch ends
                wait = self._wait(group[0])
                if wait > 0:
                    self._timer = asyncio.get_running_loop().call_later(wait, self.pump)
                    return
            for p in group:
                self.pending.remove(p)
            self.running += 1
            self.isolated_running = group[0].isolate
            task = asyncio.ensure_future(self._run(group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _wait(self, oldest: Pending) -> float:
        """How much longer an idle engine's partial group waits: for announced items, up to
        `max_wait` from its oldest; else `linger` past the newest item queued, within the same."""
        now = time.monotonic()
        bound = oldest.arrived + self.max_wait_s - now
        if self.expected > 0:
            return bound
        return min(bound, self.pending[-1].arrived + self.linger_s - now)

    async def _run(self, group: list[Pending]) -> None:
        try:
            await self._run_batch(group)
        except BaseException as exc:  # the runner settles futures; this is a last resort
            for p in group:
                if not p.future.done():
                    p.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            log.exception("batch runner failed")
        finally:
            self.running -= 1
            if group[0].isolate:
                self.isolated_running = False
            self.pump()
