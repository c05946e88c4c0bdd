"""What a failed device step says about the device: the one place that classifies it.

Out of memory is the batch's fault more often than an item's: the rows run again alone (as
for any failure), and one that still runs out alone fails with `out_of_memory`, never retried
in a loop. A sticky error (an illegal memory access, a device-side assert, a failed launch)
leaves the process's CUDA context unusable: every later call fails the same way, so nothing is
retried; the items held fail with `DeviceLost` and the worker hands them back and exits
(handler.py, exits.py) for the launcher to start a clean process.
"""

import torch

from shared.errors import FibermillError

# RuntimeError messages of a broken CUDA context. torch.AcceleratorError (torch 2.8+) carries
# the same; older versions raise a plain RuntimeError.
STICKY_MESSAGES = (
    "an illegal memory access",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "an illegal instruction",
)
# Out of memory that is not a torch.OutOfMemoryError: the CPU allocator's, and a CUDA library
# failing to allocate its workspace.
OOM_MESSAGES = ("can't allocate memory", "DefaultCPUAllocator", "CUDA error: out of memory",
                "CUBLAS_STATUS_ALLOC_FAILED")


class OutOfDeviceMemory(FibermillError):
    """An item ran out of memory alone: it is too large for this worker."""

    code = "out_of_memory"


class DeviceLost(FibermillError):
    """The device failed in a way no later call recovers from; the item goes back to its queue."""

    code = "device_lost"


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in OOM_MESSAGES)


def is_sticky(exc: BaseException) -> bool:
    if is_out_of_memory(exc) or not isinstance(exc, RuntimeError):
        return False
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return True
    return any(m in str(exc) for m in STICKY_MESSAGES)


def failed_alone(exc: Exception, what: str) -> Exception:
    """What an item that failed alone fails with: out of memory named as such."""
    if is_out_of_memory(exc):
        error = OutOfDeviceMemory(f"{what} ran out of memory alone: {type(exc).__name__}: {exc}")
        error.__cause__ = exc
        return error
    return exc


def lost(exc: Exception) -> DeviceLost:
    error = DeviceLost(f"the device failed and cannot recover: {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error
