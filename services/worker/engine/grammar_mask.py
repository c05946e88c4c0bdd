"""The bitmask of a batch's rows: filled on the host, one row per decoder row, and applied to
the logits in one op.

A row's mask is `ceil(vocab / 32)` int32 words, bit t of word t // 32 set when token t is
allowed (llguidance's layout). A row without a grammar is all ones, so applying the whole
bitmask leaves its logits as they were: the decoder applies it once to all rows, and only when
some row has a grammar.

On the CPU the bits are unpacked by numpy (`unpackbits`) from the inverted words, which
benchmarks/grammar_cost.py measured at about a third of torch's shifts for the 151,936-token
vocabulary; on an accelerator, by torch's shifts on the device (the bitmask is uploaded, a
128th of the logits' bytes).
"""

from collections.abc import Sequence

import llguidance
import numpy as np
import torch

from services.worker.engine.grammar_row import RowMatcher, set_only

ALL = -1  # a row's words when every token is allowed
_SHIFTS: dict[torch.device, torch.Tensor] = {}


def words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def new_bitmask(rows: int, vocab_size: int, pin: bool = False) -> torch.Tensor:
    """A host bitmask for `rows` rows of a `vocab_size`-token model, every token allowed;
    `pin` for one uploaded to a GPU without a wait."""
    return torch.full((rows, words(vocab_size)), ALL, dtype=torch.int32, pin_memory=pin)


_executor: llguidance.LLExecutor | None = None


def fill_masks(bitmask: torch.Tensor, rows: Sequence[RowMatcher | None]) -> bool:
    """Fill `bitmask[i]` for each row i (`rows[i]`, None for a row without a grammar: all
    ones). The free rows' masks are computed together by llguidance's threads, with the GIL
    released. True when some row has a grammar (else the bitmask need not be applied)."""
    global _executor
    assert bitmask.dtype == torch.int32 and bitmask.is_contiguous() and not bitmask.is_cuda
    free: list[tuple[llguidance.LLMatcher, int]] = []
    some = False
    for i, r in enumerate(rows):
        if r is None:
            bitmask[i] = ALL
            continue
        some = True
        forced = r.forced_token()
        if forced is not None:
            set_only(bitmask[i], forced)
        else:
            free.append((r.ll, i))
    if len(free) == 1:
        matcher, i = free[0]
        row = bitmask[i]
        matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())
    elif free:
        if _executor is None:
            _executor = llguidance.LLExecutor()
        width = bitmask.shape[1] * bitmask.element_size()
        _executor.unsafe_compute_mask_ptr(free, bitmask.data_ptr(), width, bitmask.shape[0])
    return some


def apply_masks(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set to -inf, in place, every logit whose token `bitmask` does not allow: `logits` is
    (rows, vocab) on any device, `bitmask` (rows, words) int32 on the same device. Rows whose
    words are all ones are left as they were."""
    if logits.device.type == "cpu":
        unpacked(logits, bitmask)
    else:
        shifted(logits, bitmask)


def unpacked(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """`apply_masks` on the CPU: numpy unpacks the inverted words into a bool per token, for
    the rows with a grammar only (on the CPU each row's pass over its logits costs: 0.6 ms for
    151,936 tokens), each masked in place."""
    vocab = logits.shape[1]
    words = bitmask.numpy()
    masked = np.flatnonzero((words != ALL).any(axis=1))
    if len(masked) == 0:
        return
    if len(masked) == len(words):
        bits = np.unpackbits(np.invert(words).view(np.uint8), axis=-1,
                             bitorder="little")[:, :vocab]
        logits.masked_fill_(torch.from_numpy(bits.view(np.bool_)), float("-inf"))
        return
    for i in masked.tolist():
        bits = np.unpackbits(np.invert(words[i]).view(np.uint8), bitorder="little")[:vocab]
        logits[i].masked_fill_(torch.from_numpy(bits.view(np.bool_)), float("-inf"))


def shifted(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """`apply_masks` on an accelerator: each word shifted by 0..31, on the device."""
    rows, vocab = logits.shape
    shifts = _SHIFTS.get(logits.device)
    if shifts is None:
        shifts = _SHIFTS[logits.device] = torch.arange(32, dtype=torch.int32,
                                                       device=logits.device)
    off = ((bitmask.unsqueeze(-1) >> shifts) & 1) == 0
    logits.masked_fill_(off.view(rows, -1)[:, :vocab], float("-inf"))
