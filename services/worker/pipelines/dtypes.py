"""Which dtype a model runs in: the registry's choice, or, for `auto`, what the device does
best. A GPU serves in half precision (bf16 where the device has it, else fp16: half the
memory of float32 for the weights and the KV cache, and the tensor cores' rate); the CPU in
float32, since its half-precision matmuls are slower on most hosts than float32 ones. A model
the registry keeps in float32 gets TF32 matmuls on a GPU (`allow_tf32`)."""

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


def allow_tf32(device: torch.device) -> None:
    """Let float32 matmuls and convolutions on a CUDA device use TF32 tensor cores (10-bit
    mantissa products, float32 sums): several times the float32 rate on Ampere and later, at
    about half-precision rounding in the products, which a model served in float32 on purpose
    tolerates as the half-precision default does. Process-wide, so the worker sets it once at
    start; the CPU's matmuls are left alone."""
    if device.type != "cuda":
        return
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch 2.9+: the legacy flags warn when mixed
        matmul.fp32_precision = "tf32"
        # The module adds `conv` at import; its stubs do not declare it.
        torch.backends.cudnn.conv.fp32_precision = "tf32"  # type: ignore[attr-defined]
    else:
        matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
