"""The scheduler: walks a graph for one batch, running each operator on its executor.

`run_async` never runs an operator on the event loop: device operators go to the model's own
single-thread executor (a model object is never run by two threads at once), CPU operators to
a shared pool, so the CPU phases of one batch overlap the device phase of another. The
sub-graphs of a SPLIT run concurrently and are collected as they finish, then joined in input
order. Each operator is timed into `fibermill_phase_duration_seconds{model,phase}`.
"""

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from services.worker.engine.batch import Batch
from services.worker.engine.graph import Graph
from services.worker.engine.operator import Operator
from services.worker.engine.router import END, JOIN, START, Branch, Split
from shared.errors import GraphError


class Scheduler:
    def __init__(
        self, device: Executor, cpu: Executor, model: str = "", observe_phase=None
    ) -> None:
        self.executors = {"device": device, "cpu": cpu}
        self.model = model
        self._observe = observe_phase

    async def run_async(self, graph: Graph, value: Any, batch: Batch) -> Any:
        """Walk `graph` from START with `value`; returns what reaches END."""
        return await self._walk(graph, START, value, batch, stop_at=END)

    async def _walk(self, graph: Graph, current: str, value: Any, batch: Batch, stop_at: str):
        while True:
            route = graph.router.next(current)
            if route == stop_at:
                return value
            if route in (END, JOIN):
                raise GraphError(f"{current!r} routes to {route} outside its scope")
            if isinstance(route, Split):
                value = await self._split(graph, route, value, batch)
                if route.then == stop_at:
                    return value
                current = route.then
            elif isinstance(route, Branch):
                current = self._choose(graph, route, value, batch)
            else:
                current = route
            value = await self._run(graph[current], value, batch)

    def _choose(self, graph: Graph, branch: Branch, value: Any, batch: Batch) -> str:
        for name in branch.candidates:
            if graph[name].can_operate(value, batch):
                return name
        raise GraphError(f"no operator of {branch.candidates} takes {type(value).__name__}")

    async def _split(self, graph: Graph, split: Split, values: Sequence[Any], batch: Batch):
        async def one(i: int, v: Any) -> tuple[int, Any]:
            first = await self._run(graph[split.each], v, batch)
            return i, await self._walk(graph, split.each, first, batch, stop_at=JOIN)

        tasks = [asyncio.ensure_future(one(i, v)) for i, v in enumerate(values)]
        joined: list[Any] = [None] * len(tasks)
        try:
            for done in asyncio.as_completed(tasks):
                i, result = await done
                joined[i] = result
        finally:
            for t in tasks:
                t.cancel()  # a failed element fails the split; stop the rest
            # ...and wait for them: an operator still running may use the batch's buffers.
            await _settled(asyncio.gather(*tasks, return_exceptions=True))
        return joined

    async def _run(self, op: Operator, value: Any, batch: Batch) -> Any:
        if not isinstance(value, op.input_type):
            raise GraphError(
                f"{op.name} takes {op.input_type}, got {type(value).__name__}"
            )
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        running = loop.run_in_executor(self.executors[op.executor], op.run, value, batch)
        try:
            out = await asyncio.shield(running)
        except asyncio.CancelledError:
            # A thread cannot be stopped: the operator runs on with the batch's buffers, so
            # the batch must not end (and give them back) before it has.
            await _settled(running)
            raise
        if self._observe is not None:
            self._observe(self.model, op.name, time.perf_counter() - t0)
        if not isinstance(out, op.output_type):
            raise GraphError(f"{op.name} promised {op.output_type}, returned {type(out).__name__}")
        return out


async def _settled(aw: asyncio.Future) -> None:
    """Wait until `aw` is done, through any number of cancellations of the waiter."""
    while not aw.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([aw])
    if not aw.cancelled():
        aw.exception()  # retrieved: the caller reports what ended it


_cpu_lock = threading.Lock()
_cpu: ThreadPoolExecutor | None = None


def cpu_executor() -> ThreadPoolExecutor:
    """The process's shared pool for CPU operators (tokenising, PNG encoding, noise)."""
    global _cpu
    with _cpu_lock:
        if _cpu is None:
            _cpu = ThreadPoolExecutor(min(4, os.cpu_count() or 1), thread_name_prefix="cpu-op")
        return _cpu
