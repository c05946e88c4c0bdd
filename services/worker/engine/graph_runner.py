"""Running a graph model's batches: each one walked through its operator graph by a
`Scheduler` (scheduler.py), on the model's device thread and the shared CPU pool.

A group from the batcher runs as one batch; when it fails with more than one item, each item
runs again alone, so a failing batch fails exactly the items that fail alone (an item's result
is the same alone or batched) and the engine keeps serving. Out of memory is handled the same
way, and a sticky device error runs nothing again (device_faults.py). A batch that ends
because every item in it was asked to stop (a cancel, a time limit, a drain) did not fail: its
items are settled as stopped, and nothing runs again.
"""

import asyncio
import logging

from services.worker import metrics
from services.worker.engine import device_faults
from services.worker.engine.batch import Batch
from services.worker.engine.batcher import Pending
from services.worker.engine.model_code import GraphModel
from services.worker.engine.results import Result
from services.worker.engine.scheduler import Scheduler, cpu_executor
from services.worker.engine.settle import settle
from services.worker.engine.start import OnStart, announce_start
from services.worker.engine.stopped import PipelineStopped

log = logging.getLogger(__name__)


def observe_phase(model: str, phase: str, seconds: float) -> None:
    metrics.PHASE_SECONDS.labels(model, phase).observe(seconds)


class GraphRunner:
    def __init__(self, model: GraphModel, on_start: OnStart | None = None) -> None:
        """`on_start` hears the tags of the items about to start on the device, before they
        start (start.py)."""
        self.model = model
        self.name = model.spec.name
        self.on_start = on_start
        self.scheduler = Scheduler(model.device_executor, cpu_executor(), self.name,
                                   observe_phase)

    async def run(self, batch: Batch) -> list[Result]:
        """Run one batch through the graph. The batch's buffer leases are returned however
        the run ends."""
        keys = {self.model.batch_key(item) for item in batch.items}
        if len(keys) != 1:
            raise ValueError(
                f"items in one batch must share size, steps and whether guided: {keys}")
        try:
            return await self.scheduler.run_async(self.model.graph, batch.items, batch)
        finally:
            batch.close()

    async def run_group(self, group: list[Pending]) -> None:
        """Run a group from the batcher and settle every item's future."""
        metrics.BATCH_SIZE.labels(self.name).observe(len(group))
        try:
            await self._run_group(group)
        except PipelineStopped:
            # Batch.check_stops raises it once no item is left running: each one stopped, and
            # heard so through `on_stop`. Not a failure: no item runs again.
            log.debug("a batch of %d %s items stopped: every item was asked to stop",
                      len(group), self.name)
            metrics.BATCHES_STOPPED.labels(self.name).inc()
            for p in group:
                settle(p.future, None, PipelineStopped())
        except Exception as exc:
            if device_faults.is_sticky(exc):
                # Nothing runs again on this device: each item goes back (handler.py).
                log.critical("a batch of %d %s items hit a sticky device error: %s: %s",
                             len(group), self.name, type(exc).__name__, exc)
                for p in group:
                    settle(p.future, None, device_faults.lost(exc))
                return
            if len(group) == 1:
                settle(group[0].future, None, device_faults.failed_alone(exc, "an item"))
                return
            log.warning("a batch of %d %s items failed (%s: %s); running them one by one",
                        len(group), self.name, type(exc).__name__, exc)
            metrics.BATCHES_ISOLATED.labels(self.name).inc()
            for p in group:
                if p.future.done():
                    continue
                try:
                    await self._run_group([p])
                except Exception as alone:
                    if device_faults.is_sticky(alone):
                        for q in group:
                            settle(q.future, None, device_faults.lost(alone))
                        return
                    settle(p.future, None, device_faults.failed_alone(alone, "an item"))

    async def _run_group(self, group: list[Pending]) -> None:
        """Run the group as one batch and settle every future; raise what failed it."""
        loop = asyncio.get_running_loop()

        def stopped(i: int) -> None:
            # Called on the device thread between steps.
            loop.call_soon_threadsafe(settle, group[i].future, None, PipelineStopped())

        batch = Batch([p.item for p in group], [p.should_stop for p in group], on_stop=stopped)
        await announce_start(self.on_start, group)
        results = await self.run(batch)
        for p, result in zip(group, results, strict=True):
            settle(p.future, result, None)
