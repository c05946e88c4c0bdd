"""What every pipeline offers the worker: load once on a device, then hand the engine its model
code (engine/model_code.py), which the engine schedules.

A pipeline owns the read-only state (weights, configs), its preallocated device buffers and the
single device thread its model runs on. Image pipelines offer an operator graph
(`GraphPipeline`), run batch by batch; text offers a KV-cached forward that the engine's
continuous decoder drives (engine/decoder.py).
"""

from abc import ABC, abstractmethod
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from services.worker import metrics
from services.worker.engine.buffers import BucketKey, BufferPool
from services.worker.engine.graph import Graph
from services.worker.engine.model_code import GraphCode, ModelCode
from services.worker.pipelines.dtypes import resolve_dtype
from shared.registry import ModelSpec


class Pipeline(ABC):
    """Loaded once per worker process (`setup`); its model only ever runs on its device thread."""

    def __init__(self, spec: ModelSpec, device: torch.device) -> None:
        self.spec = spec
        self.device = device
        self.dtype = resolve_dtype(spec.dtype, device)
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
    def model_code(self) -> ModelCode:
        """What the engine schedules, and so how: batched graphs or continuous steps."""

    def observe(self, phase: str, seconds: float) -> None:
        metrics.PHASE_SECONDS.labels(self.spec.name, phase).observe(seconds)


class GraphPipeline(Pipeline):
    """A pipeline that runs each batch through an operator graph, with a buffer pool."""

    graph: Graph
    pool: BufferPool

    def model_code(self) -> GraphCode:
        return GraphCode(self)

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
    def batch_key(self, item: Any) -> Hashable:
        """Items with equal keys may run in one batch."""
