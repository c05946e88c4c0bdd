"""One model's engine, on the worker's event loop: an image pipeline fed by a dynamic batcher,
or a text pipeline's continuous decoder (pipelines/text_decoder.py).

`submit` returns the item's own result, or raises what failed its batch: a failing batch fails
exactly its own sub-requests, the engine keeps serving. An item whose stop hook fires ends at
once with PipelineStopped while the rest of its batch runs on.
"""

import asyncio
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from services.worker import metrics
from services.worker.engine.batch import Batch, ShouldStop
from services.worker.engine.batcher import Batcher, Pending
from services.worker.engine.settle import settle
from services.worker.engine.start import OnStart, announce_start
from services.worker.pipelines.base import GraphPipeline, ImageResult, Pipeline, TextResult
from services.worker.pipelines.stopped import PipelineStopped
from services.worker.pipelines.text_decoder import Decoder
from services.worker.pipelines.text_stream import OnText
from shared.messages import ImageItem, TextItem

log = logging.getLogger(__name__)


class Arrival:
    """A sub-request on its way to the engine; the batcher waits for it briefly."""

    def __init__(self, engine: "Engine") -> None:
        self.engine = engine
        self.submitted = False

    async def submit(self, item, should_stop: ShouldStop | None = None,
                     withdrawn: Callable[[], bool] | None = None, tag: str | None = None,
                     isolate: bool = False, on_text: OnText | None = None,
                     charged: bool = False):
        self.submitted = True
        self.engine.intake.expected -= 1
        return await self.engine.submit(item, should_stop, withdrawn, tag, isolate, on_text,
                                        charged)

    def starts_soon(self) -> bool:
        """Whether it would start on the device at the engine's next iteration, were it
        submitted now: then its attempt is charged with its lease (engine/start.py). Image
        batches gather for a while and run whole, so an image item never does."""
        intake = self.engine.intake
        return isinstance(intake, Decoder) and intake.starts_soon()


class Engine:
    def __init__(self, pipeline: Pipeline, batching: bool = True,
                 on_start: OnStart | None = None) -> None:
        """`on_start` hears the tags of the items about to start on the device, before they
        start (engine/start.py)."""
        self.pipeline = pipeline
        self.on_start = on_start
        spec = pipeline.spec
        self.model = spec.name
        max_batch = spec.max_batch if batching else 1
        self.intake: Batcher | Decoder
        if isinstance(pipeline, GraphPipeline):
            self.batcher = Batcher(self._run, max_batch, spec.max_wait_ms / 1000,
                                   linger_s=spec.linger_ms / 1000)
            self.intake = self.batcher
        else:
            # Text decodes continuously: its decoder admits items between steps.
            self.decoder: Decoder = pipeline.decoder
            self.decoder.slots = min(self.decoder.slots, max_batch)
            self.decoder.on_start = on_start
            self.intake = self.decoder

    @contextmanager
    def arrival(self) -> Iterator[Arrival]:
        """Announce a sub-request before its (awaited) preliminaries; submit through it."""
        arrival = Arrival(self)
        self.intake.expected += 1
        try:
            yield arrival
        finally:
            if not arrival.submitted:
                self.intake.expected -= 1
                self.intake.pump()

    async def submit(
        self, item: TextItem | ImageItem, should_stop: ShouldStop | None = None,
        withdrawn: Callable[[], bool] | None = None, tag: str | None = None,
        isolate: bool = False, on_text: OnText | None = None, charged: bool = False,
    ) -> TextResult | ImageResult:
        """The item's result. `should_stop` is its stop hook between steps; `withdrawn` says,
        without counting a step, that it was stopped while still queued; `tag` names it to
        `on_start`, unless it was `charged` already; an `isolate`d item runs alone; `on_text`
        hears a text item's text as it is decoded (image items have none)."""
        if isinstance(self.intake, Decoder):
            return await self.intake.submit(item, should_stop, withdrawn, tag, isolate, on_text,
                                            charged)
        key = self.pipeline.batch_key(item)
        return await self.batcher.submit(item, key, should_stop, withdrawn, tag, isolate,
                                         charged)

    def poke(self) -> None:
        """Something queued may have been withdrawn: let it go now."""
        self.intake.pump()

    async def _run(self, group: list[Pending]) -> None:
        metrics.BATCH_SIZE.labels(self.model).observe(len(group))
        try:
            await self._run_batch(group)
        except Exception as exc:
            if len(group) == 1:
                settle(group[0].future, None, exc)
                return
            # One item's error must not fail its neighbours: run each one alone, and fail
            # only those that fail alone (each item's result is the same alone or batched).
            log.warning("a batch of %d %s items failed (%s: %s); running them one by one",
                        len(group), self.model, type(exc).__name__, exc)
            metrics.BATCHES_ISOLATED.labels(self.model).inc()
            for p in group:
                if p.future.done():
                    continue
                try:
                    await self._run_batch([p])
                except Exception as alone:
                    settle(p.future, None, alone)

    async def _run_batch(self, group: list[Pending]) -> None:
        """Run the group as one batch and settle every future; raise what failed it."""
        loop = asyncio.get_running_loop()

        def stopped(i: int) -> None:
            # Called on the device thread between steps.
            loop.call_soon_threadsafe(settle, group[i].future, None, PipelineStopped())

        batch = Batch(
            [p.item for p in group], [p.should_stop for p in group], on_stop=stopped
        )
        await announce_start(self.on_start, group)
        results = await self.pipeline.run_async(batch)
        for p, result in zip(group, results, strict=True):
            settle(p.future, result, None)
