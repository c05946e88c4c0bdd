"""One model's engine, on the worker's event loop: it feeds the model's items to the
scheduling built for what its pipeline offers (factory.py), and never asks which one it is.

`submit` returns the item's own result, or raises what failed it: a failing batch fails exactly
its own sub-requests, the engine keeps serving. An item whose stop hook fires ends at once with
PipelineStopped while the rest of its batch runs on.
"""

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from services.worker.engine.batch import Batch, ShouldStop
from services.worker.engine.factory import build_scheduling
from services.worker.engine.model_code import Servable
from services.worker.engine.results import Result
from services.worker.engine.scheduling import PLAIN, Scheduling, Ticket
from services.worker.engine.start import OnStart


class Arrival:
    """A sub-request on its way to the engine; its scheduling waits for it briefly."""

    def __init__(self, engine: "Engine") -> None:
        self.engine = engine
        self.submitted = False

    async def submit(self, item: Any, ticket: Ticket = PLAIN) -> Result:
        self.submitted = True
        self.engine.scheduling.expected -= 1
        return await self.engine.submit(item, ticket)

    def starts_soon(self) -> bool:
        """Whether it would start on the device at the engine's next iteration, were it
        submitted now: then its attempt is charged with its lease (start.py)."""
        return self.engine.scheduling.starts_soon()


class Engine:
    def __init__(self, pipeline: Servable, batching: bool = True,
                 on_start: OnStart | None = None) -> None:
        """`on_start` hears the tags of the items about to start on the device, before they
        start (start.py)."""
        self.pipeline = pipeline
        self.model = pipeline.spec.name
        max_batch = pipeline.spec.max_batch if batching else 1
        self.scheduling: Scheduling = build_scheduling(pipeline.model_code(), max_batch,
                                                       on_start)

    @contextmanager
    def arrival(self) -> Iterator[Arrival]:
        """Announce a sub-request before its (awaited) preliminaries; submit through it."""
        arrival = Arrival(self)
        self.scheduling.expected += 1
        try:
            yield arrival
        finally:
            if not arrival.submitted:
                self.scheduling.expected -= 1
                self.scheduling.pump()

    async def submit(self, item: Any, ticket: Ticket = PLAIN) -> Result:
        """The item's result, run as its ticket says."""
        return await self.scheduling.submit(item, ticket)

    def poke(self) -> None:
        """Something queued may have been withdrawn: let it go now."""
        self.scheduling.pump()

    async def run_async(self, batch: Batch) -> list[Result]:
        """Run a batch's items together at once, outside the queue; result i belongs to item
        i. Each item's randomness comes from its own seed only, so its result is the same
        alone or batched."""
        return await self.scheduling.run_together(batch)

    def run(self, items: Sequence[Any], should_stop: ShouldStop | None = None) -> list[Result]:
        """Run a batch from synchronous code (tests, benchmarks, offline sampling);
        `should_stop` stops it all."""
        if not items:
            return []
        return asyncio.run(self.run_async(Batch(items, stop_all=should_stop)))
