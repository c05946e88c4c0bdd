"""Which dtype a model runs in: the registry's choice, or, for `auto`, what the device does
best. A GPU serves in half precision (bf16 where the device has it, else fp16: half the
memory of float32 for the weights and the KV cache, and the tensor cores' rate); the CPU in
float32, since its half-precision matmuls are slower on most hosts than float32 ones."""

import torch

from shared.registry import DType

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_dtype(requested: DType, device: torch.device,
                  bf16_supported: bool | None = None) -> torch.dtype:
    """`bf16_supported` stands in for asking the device (tests); None asks it."""
    if requested != "auto":
        return DTYPES[requested]
    if device.type != "cuda":
        return torch.float32
    if bf16_supported is None:
        bf16_supported = torch.cuda.is_bf16_supported()
    return torch.bfloat16 if bf16_supported else torch.float16
