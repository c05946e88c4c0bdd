"""What every pipeline offers the worker: load once on a device, then run items.

A pipeline owns the read-only state (weights, configs), its preallocated device buffers and the
single device thread its model runs on. Image pipelines run each batch as an operator graph
(`GraphPipeline`); text runs with continuous batching (pipelines/text_decoder.py).
"""

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from services.worker import metrics
from services.worker.engine.batch import Batch, ShouldStop
from services.worker.engine.buffers import BucketKey, BufferPool
from services.worker.engine.graph import Graph
from services.worker.engine.scheduler import Scheduler, cpu_executor
from shared.messages import FinishReason, ImageItem, TextItem
from shared.registry import ModelSpec

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

__all__ = ["DTYPES", "GraphPipeline", "ImageResult", "Pipeline", "ShouldStop", "TextResult"]


@dataclass
class TextResult:
    text: str
    finish_reason: FinishReason
    tokens: int  # number of generated tokens
    prompt_tokens: int | None = None  # prompt ids the model read (after truncation)


@dataclass
class ImageResult:
    png: bytes
    width: int
    height: int
    seed: int


def observe_phase(model: str, phase: str, seconds: float) -> None:
    metrics.PHASE_SECONDS.labels(model, phase).observe(seconds)


class Pipeline(ABC):
    """Loaded once per worker process (`setup`); its model only ever runs on its device thread."""

    def __init__(self, spec: ModelSpec, device: torch.device) -> None:
        self.spec = spec
        self.device = device
        self.dtype = DTYPES[spec.dtype]
        self.device_executor = ThreadPoolExecutor(1, thread_name_prefix=f"device-{spec.name}")

    def setup(self) -> None:
        """Load the weights, then preallocate what running needs, on the device thread.

        The thread that runs the model is then the only one that ever ran torch work for it.
        On the CPU this matters: each thread that runs torch ops gets its own OpenMP team,
        and a model loaded on one thread and run on another ran at 0.4x (tiny GPT-2) to 0.8x
        (a 6x256 GPT-2) of its speed (`make bench`, the engine in process)."""
        self.device_executor.submit(self._setup).result()

    def _setup(self) -> None:
        self.load()
        self.prepare()

    @abstractmethod
    def load(self) -> None:
        """Load weights from `spec.path` with `local_files_only=True` onto `self.device`."""

    @abstractmethod
    def prepare(self) -> None:
        """Allocate the device buffers the model runs with, once."""

    @abstractmethod
    async def run_async(self, batch: Batch) -> list[TextResult | ImageResult]:
        """Run a batch's items; result i belongs to item i. Each item's randomness comes from
        its own seed only, so its result is the same alone or batched."""

    def observe(self, phase: str, seconds: float) -> None:
        observe_phase(self.spec.name, phase, seconds)

    def run(
        self, items: Sequence[TextItem | ImageItem], should_stop: ShouldStop | None = None
    ) -> list[TextResult | ImageResult]:
        """Run a batch from synchronous code (tests, benchmarks); `should_stop` stops it all."""
        if not items:
            return []
        return asyncio.run(self.run_async(Batch(items, stop_all=should_stop)))


class GraphPipeline(Pipeline):
    """A pipeline that runs each batch through an operator graph, with a buffer pool."""

    graph: Graph
    pool: BufferPool

    def __init__(self, spec: ModelSpec, device: torch.device) -> None:
        super().__init__(spec, device)
        self.scheduler = Scheduler(
            self.device_executor, cpu_executor(), spec.name, observe_phase
        )

    def prepare(self) -> None:
        """Wire the graph and preallocate the buffer pool."""
        self.graph = self.build_graph()
        self.pool = BufferPool(
            self.spec.name, self.allocate, self.pool_buckets(), self.spec.pool_sets
        )

    @abstractmethod
    def build_graph(self) -> Graph:
        """The operator graph a batch runs through: list of items in, list of results out."""

    @abstractmethod
    def allocate(self, key: BucketKey) -> dict[str, Any]:
        """Allocate one buffer set for a shape bucket."""

    @abstractmethod
    def pool_buckets(self) -> list[BucketKey]:
        """The buckets preallocated at start (`spec.pool_sets` sets each)."""

    @abstractmethod
    def batch_key(self, item: TextItem | ImageItem) -> Hashable:
        """Items with equal keys may run in one batch."""

    async def run_async(self, batch: Batch) -> list[TextResult | ImageResult]:
        """Run one batch through the graph. The batch's buffer leases are returned however
        the run ends."""
        keys = {self.batch_key(item) for item in batch.items}
        if len(keys) != 1:
            raise ValueError(
                f"items in one batch must share size, steps and whether guided: {keys}")
        try:
            return await self.scheduler.run_async(self.graph, batch.items, batch)
        finally:
            batch.close()
