"""What every pipeline offers the worker: load once on a device, run a batch of items."""

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from shared.registry import ModelSpec
from shared.subrequest import ImageItem, TextItem

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# Called between denoise / decode steps; True asks the pipeline to stop early.
ShouldStop = Callable[[], bool]


@dataclass
class TextResult:
    text: str
    finish_reason: Literal["stop", "length", "canceled"]
    tokens: int  # number of generated tokens


@dataclass
class ImageResult:
    png: bytes
    width: int
    height: int
    seed: int


class Pipeline(ABC):
    """Loaded once per worker process (`setup`), then only ever run by one thread at a time."""

    def __init__(self, spec: ModelSpec, device: torch.device) -> None:
        self.spec = spec
        self.device = device
        self.dtype = DTYPES[spec.dtype]

    @abstractmethod
    def setup(self) -> None:
        """Load weights from `spec.path` with `local_files_only=True` onto `self.device`."""

    @abstractmethod
    def run(
        self, items: Sequence[TextItem | ImageItem], should_stop: ShouldStop | None = None
    ) -> list[TextResult | ImageResult]:
        """Run a batch of compatible items; result i belongs to item i.

        Each item's randomness comes from its own seed only, so an item's result is the
        same whether it runs alone or in a batch.
        """
