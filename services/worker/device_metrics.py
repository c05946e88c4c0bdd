"""Device memory, read when /metrics is scraped:

- `fibermill_device_memory_allocated_bytes{device}`: memory held by tensors
  (`torch.cuda.memory_allocated`);
- `fibermill_device_memory_reserved_bytes{device}`: memory the caching allocator holds from the
  driver, allocated or cached for reuse (`torch.cuda.memory_reserved`); what `nvidia-smi`
  shows for the process, less the CUDA context.

`device` is `cuda:<id>`, the GPU's id as the host numbers it (the process's
`CUDA_VISIBLE_DEVICES` entry; the launcher pins one per worker), for every GPU this process
has initialised. A worker that runs on the CPU reports one series, `device="cpu"`, at 0: the
series exist on every worker so dashboards and alerts work the same everywhere (host memory is
the node exporter's business).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

ALLOCATED = "fibermill_device_memory_allocated_bytes"
RESERVED = "fibermill_device_memory_reserved_bytes"
_HELP = {
    ALLOCATED: "Device memory held by tensors (torch.cuda.memory_allocated); 0 on a CPU worker",
    RESERVED: "Device memory held by the caching allocator (torch.cuda.memory_reserved); "
    "0 on a CPU worker",
}


def device_names(count: int) -> list[str]:
    """Labels for the process's CUDA devices 0..count-1: the host's GPU ids when
    CUDA_VISIBLE_DEVICES names them, else the process's own indices."""
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    visible = [d for d in visible if d]
    ids = visible if len(visible) >= count else [str(i) for i in range(count)]
    return [f"cuda:{ids[i]}" for i in range(count)]


def read_memory() -> list[tuple[str, int, int]]:
    """(device, allocated bytes, reserved bytes) per device; `("cpu", 0, 0)` without CUDA."""
    try:
        import torch
    except ImportError:
        return [("cpu", 0, 0)]
    # Only a process that already uses CUDA is asked: a scrape must never initialise it.
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return [("cpu", 0, 0)]
    count = torch.cuda.device_count()
    return [
        (name, int(torch.cuda.memory_allocated(i)), int(torch.cuda.memory_reserved(i)))
        for i, name in enumerate(device_names(count))
    ]


class DeviceMemoryCollector:
    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Names only: registering must not touch the device.
        for name in (ALLOCATED, RESERVED):
            yield GaugeMetricFamily(name, _HELP[name], labels=["device"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        allocated = GaugeMetricFamily(ALLOCATED, _HELP[ALLOCATED], labels=["device"])
        reserved = GaugeMetricFamily(RESERVED, _HELP[RESERVED], labels=["device"])
        for device, alloc, resv in read_memory():
            allocated.add_metric([device], alloc)
            reserved.add_metric([device], resv)
        yield allocated
        yield reserved


_registered: weakref.WeakSet[CollectorRegistry] = weakref.WeakSet()


def register_device_metrics(registry: CollectorRegistry = REGISTRY) -> None:
    """Add the collector to `registry` once (later calls do nothing)."""
    if registry in _registered:
        return
    registry.register(DeviceMemoryCollector())
    _registered.add(registry)
