"""The KV cache of continuous batching: fixed slots, one row per running sequence.

Keys and values live in one preallocated (slots, kv_heads, length, head_dim) tensor per layer.
Running rows occupy slots 0..n-1 (a retired row's slot is refilled by the last one, so the
decode step runs on exactly the running rows), and every row writes the same column each
step. A row's own columns are the ones marked in `valid`; everything else in its slot is masked
out, so rows of any age share one step. When the shared column reaches the end, `compact`
moves each row's columns to the front, in order.

Keys are stored after the model applied positions to them (GPT-2 adds position embeddings to
the input; rotary models rotate keys before caching), so moving a column never changes what it
means: only the mask and the position ids decide attention.

It is handed to the model as its cache: the model calls `update` once per layer.
"""

from dataclasses import dataclass

import torch


@dataclass
class Shape:
    layers: int
    kv_heads: int
    head_dim: int


class SlotCache:
    def __init__(self, shape: Shape, slots: int, length: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        size = (slots, shape.kv_heads, length, shape.head_dim)
        self.keys = [torch.zeros(size, dtype=dtype, device=device) for _ in range(shape.layers)]
        self.values = [torch.zeros(size, dtype=dtype, device=device)
                       for _ in range(shape.layers)]
        self.valid = torch.zeros((slots, length), dtype=torch.bool, device=device)
        self.slots, self.length = slots, length
        self.column = 0  # the next column every row writes
        # What the next forward writes: rows [lo, hi), columns [c0, c1).
        self._rows = slice(0, 0)
        self._cols = slice(0, 0)
        self._reads = 0  # columns the attention reads back (decode: all up to c1)

    # The model's side --------------------------------------------------------------------

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k[self._rows, :, self._cols] = key_states
        v[self._rows, :, self._cols] = value_states
        reads = slice(self._reads, self._cols.stop)
        return k[self._rows, :, reads], v[self._rows, :, reads]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._cols.stop

    # The decoder's side ------------------------------------------------------------------

    def for_prefill(self, rows: slice, width: int) -> None:
        """The next forward writes prompts of `width` into the slots `rows`, ending just
        before the shared column; they attend to themselves only."""
        start = self.column - width
        self._rows, self._cols, self._reads = rows, slice(start, self.column), start

    def for_decode(self, n: int, start: int = 0) -> None:
        """The next forward writes one token for rows 0..n-1 at the shared column, and reads
        back the columns from `start` (before it, no row holds any)."""
        self._rows, self._cols, self._reads = slice(0, n), slice(self.column,
                                                                self.column + 1), start

    def move(self, src: int, dst: int, lo: int, hi: int) -> None:
        """Copy slot `src` into slot `dst`: its columns [lo, hi), where all of its own lie;
        the rest of `dst` is masked out by the valid flags copied whole."""
        for k, v in zip(self.keys, self.values, strict=True):
            k[dst, :, lo:hi] = k[src, :, lo:hi]
            v[dst, :, lo:hi] = v[src, :, lo:hi]
        self.valid[dst] = self.valid[src]

    def compact(self, n: int, longest: int) -> None:
        """Move each of rows 0..n-1's columns to the front, in order, ending at `longest`
        (the most columns any row holds), which becomes the shared column."""
        end = self.column
        # A stable sort of the valid flags puts each row's own columns last, in order.
        flags, order = self.valid[:n, :end].to(torch.uint8).sort(dim=1, stable=True)
        keep = order[:, end - longest:]  # (n, longest)
        for k, v in zip(self.keys, self.values, strict=True):
            index = keep[:, None, :, None].expand(n, k.shape[1], longest, k.shape[3])
            k[:n, :, :longest] = k[:n, :, :end].gather(2, index)
            v[:n, :, :longest] = v[:n, :, :end].gather(2, index)
        self.valid[:n, :longest] = flags[:, end - longest:].bool()
        self.valid[:n, longest:] = False
        self.column = longest
