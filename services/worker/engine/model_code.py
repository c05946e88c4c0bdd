"""What a pipeline offers the engine to schedule: model code, behind interfaces the engine owns.

A pipeline says which kind it offers (`Servable.model_code`); the engine builds the matching
scheduling for it (factory.py). Pipelines implement these; they never see how they are driven.
"""

from collections.abc import Hashable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from services.worker.engine.grammar import Grammar
from services.worker.engine.graph import Graph
from services.worker.engine.text_cache import PagedCache
from services.worker.engine.text_rows import Row
from shared.messages import ResponseFormat
from shared.registry import ModelSpec


class GraphModel(Protocol):
    """Model code run batch by batch through an operator graph, on its own device thread."""

    @property
    def spec(self) -> ModelSpec: ...

    @property
    def device_executor(self) -> Executor: ...

    @property
    def graph(self) -> Graph: ...

    def batch_key(self, item: Any) -> Hashable:
        """Items with equal keys may run in one batch."""


class StepModel(Protocol):
    """Model code a continuous decoder (decoder.py) drives: a KV-cached forward over a paged
    cache, and an item's prompt ids and text."""

    @property
    def spec(self) -> ModelSpec: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def device_executor(self) -> Executor: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def eos_ids(self) -> frozenset[int]: ...

    def kv_cache(self, rows: int) -> PagedCache:
        """The KV cache of up to `rows` rows, its pool sized by the model's memory budget;
        allocated once."""

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                cache: PagedCache) -> torch.Tensor:
        """One KV-cached forward; the last position's logits, (rows, vocab). `mask` is
        (rows, 1, queries, keys), True where a query may attend."""

    def start(self, item: Any) -> Row:
        """An item's prompt ids and budget."""

    def decode(self, ids: list[int]) -> str: ...

    def spell(self, token: int) -> tuple[str, bytes]:
        """One token's text alone, and its bytes (log-probability entries)."""

    def grammar(self, fmt: ResponseFormat) -> Grammar:
        """The grammar an item's `response_format` is decoded under."""

    def observe(self, phase: str, seconds: float) -> None:
        """Time one phase of its work."""


@dataclass(frozen=True)
class GraphCode:
    """Batched as a whole: items wait to be grouped, then run the graph together (images)."""

    model: GraphModel


@dataclass(frozen=True)
class StepCode:
    """Decoded continuously: items join and leave the running rows between steps (text)."""

    model: StepModel


ModelCode = GraphCode | StepCode


class Servable(Protocol):
    """A loaded pipeline, as an engine sees it."""

    @property
    def spec(self) -> ModelSpec: ...

    @property
    def device_executor(self) -> Executor: ...

    def model_code(self) -> ModelCode: ...
