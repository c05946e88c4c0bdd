"""How many bytes a text model's KV-cache pool may take (text_cache.py), decided once at load.

A model's own `kv_cache_bytes` (registry) comes first, then the worker's
(`FIBERMILL_KV_CACHE_BYTES`); otherwise, on a GPU, `gpu_memory_utilization` of the device memory
still free once the weights are loaded (as vLLM sizes its pool: what is left of the fraction
goes to activations and other models), and on the CPU a fixed `CPU_DEFAULT_BYTES`.
"""

from dataclasses import dataclass

import torch

CPU_DEFAULT_BYTES = 4 << 30


@dataclass(frozen=True)
class Budget:
    model_bytes: int | None = None  # the registry entry's `kv_cache_bytes`
    worker_bytes: int | None = None  # the worker's `kv_cache_bytes`
    gpu_memory_utilization: float = 0.9


def budget_bytes(budget: Budget, device: torch.device) -> int:
    if budget.model_bytes is not None:
        return budget.model_bytes
    if budget.worker_bytes is not None:
        return budget.worker_bytes
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * budget.gpu_memory_utilization)
    return CPU_DEFAULT_BYTES
