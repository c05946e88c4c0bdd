"""The one place the host waits for the device.

Device work is queued asynchronously; the host only has to wait where it reads device memory.
Every such read goes through `to_host` (or `read_flag`), which copies into a host buffer (pinned
when the device is CUDA, so the copy is a DMA), waits for the stream, and counts the sync by
model and reason, so tests and `fibermill_device_syncs_total` can hold the pipelines to one
sync per batch of outputs.
"""

import threading
from collections import Counter

import torch

from services.worker import metrics

_lock = threading.Lock()
_counts: Counter[tuple[str, str]] = Counter()


def _wait(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def _count(model: str, reason: str) -> None:
    with _lock:
        _counts[(model, reason)] += 1
    metrics.DEVICE_SYNCS.labels(model, reason).inc()


def to_host(src: torch.Tensor, staging: torch.Tensor, model: str, reason: str = "output"):
    """Copy `src` into the host tensor `staging` (same shape) and wait until it has landed."""
    staging.copy_(src, non_blocking=src.device.type == "cuda" and staging.is_pinned())
    _wait(src.device)
    _count(model, reason)
    return staging


def read_flag(flag: torch.Tensor, model: str, reason: str) -> bool:
    """Read one boolean from the device (an early-exit poll)."""
    value = bool(flag.item())  # .item() waits for the stream itself
    _count(model, reason)
    return value


def count(model: str, reason: str | None = None) -> int:
    """Syncs so far for `model` (one reason, or all of them)."""
    with _lock:
        return sum(
            n for (m, r), n in _counts.items() if m == model and (reason is None or r == reason)
        )


def pinned(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host staging buffer: page-locked when the device is CUDA, so copies are DMAs."""
    return torch.empty(shape, dtype=dtype, pin_memory=device.type == "cuda")
