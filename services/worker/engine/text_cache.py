"""The KV cache of continuous batching: one pool of pages, handed to rows as they grow.

Keys and values live in one (pages, PAGE_TOKENS, kv_heads, head_dim) tensor per layer each,
allocated once at load and sized by a memory budget (kv_budget.py), never past what the
model's own context needs for `rows` rows. A row holds the pages its tokens fill (its block
table: row `i`'s token at position `p` lies in page `table[i, p // PAGE_TOKENS]`), so 32 short
rows fit where one full-context row does. Page 0 is never a row's (page_pool.py): a block
table's unused entries point at it.

Keys are stored after the model applied positions to them (GPT-2 adds position embeddings to
the input; rotary models rotate keys before caching), so where a token lies never changes what
it means: only the mask and the position ids decide attention.

It is handed to the model as its cache: the model calls `update` once per layer. A prefill
attends to its own keys, which `update` hands back as it got them; a decode step attends to
each row's pages, gathered into one (rows, heads, pages x PAGE_TOKENS, head_dim) view per
layer, from indices computed once per step for all layers. On a GPU a paged-attention kernel
would read the pages in place instead (docs/architecture.md).
"""

from dataclasses import dataclass

import torch

from services.worker.engine.page_pool import PagePool

# Tokens per page. Measured on the 6x256 GPT-2 and tiny-gpt2 at 32 rows: 16 and 32 cost the
# same per step; 16 wastes less of a row's last page.
PAGE_TOKENS = 16


@dataclass
class Shape:
    layers: int
    kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class Sizing:
    rows: int  # the most rows running at once
    context: int  # the most tokens a row holds
    budget: int  # bytes the pool may take


def pages_for(tokens: int) -> int:
    return -(-tokens // PAGE_TOKENS)


class PagedCache:
    def __init__(self, shape: Shape, sizing: Sizing, dtype: torch.dtype, device: torch.device,
                 model: str) -> None:
        self.length = sizing.context
        self.row_pages = pages_for(sizing.context)
        token_bytes = 2 * shape.layers * shape.kv_heads * shape.head_dim * dtype.itemsize
        wanted = sizing.budget // (token_bytes * PAGE_TOKENS)
        # At least one full-context row, so that every row fits once it runs alone.
        usable = max(self.row_pages, min(wanted, sizing.rows * self.row_pages))
        self.pool = PagePool(usable + 1, model)
        size = (usable + 1, PAGE_TOKENS, shape.kv_heads, shape.head_dim)
        self.keys = [torch.zeros(size, dtype=dtype, device=device) for _ in range(shape.layers)]
        self.values = [torch.zeros(size, dtype=dtype, device=device)
                       for _ in range(shape.layers)]
        self.table = torch.zeros((sizing.rows, self.row_pages), dtype=torch.long, device=device)
        self.pages: list[list[int]] = [[] for _ in range(sizing.rows)]
        # What the next forward does: the token slots it writes, and the pages it reads back
        # for (rows, pages per row) or, for a prefill, none.
        self._write = torch.zeros(0, dtype=torch.long, device=device)
        self._read: torch.Tensor | None = None
        self._reads = (0, 0)
        # Where a decode step gathers each layer's keys and values: reused by every layer,
        # grown when a step needs more.
        self._gathered = [torch.zeros(0, dtype=dtype, device=device) for _ in range(2)]

    # The model's side --------------------------------------------------------------------

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        read = self._read
        out = []
        for i, (states, pool) in enumerate(((key_states, self.keys[layer_idx]),
                                            (value_states, self.values[layer_idx]))):
            rows, heads, queries, dim = states.shape
            tokens = states.transpose(1, 2).reshape(rows * queries, heads, dim)
            pool.view(-1, heads, dim).index_copy_(0, self._write, tokens)
            if read is None:
                continue
            n, m = self._reads
            flat = pool.view(pool.shape[0], -1)
            gathered = self._buffer(i, n * m * flat.shape[1]).view(n * m, flat.shape[1])
            torch.index_select(flat, 0, read, out=gathered)
            out.append(gathered.view(n, m * PAGE_TOKENS, heads, dim).transpose(1, 2))
        if read is None:
            return key_states, value_states
        return out[0], out[1]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Keys before this forward's: none for a prefill (it attends to itself)."""
        return 0 if self._read is None else self._reads[1] * PAGE_TOKENS - 1

    def _buffer(self, i: int, numel: int) -> torch.Tensor:
        if self._gathered[i].numel() < numel:
            # Doubling, up to every row at full context: a few allocations at most.
            most = len(self.pages) * self.row_pages * self.keys[0][0].numel()
            grown = max(numel, min(2 * self._gathered[i].numel(), most))
            self._gathered[i] = torch.empty(grown, dtype=self.keys[0].dtype,
                                            device=self.keys[0].device)
        return self._gathered[i][:numel]

    # The decoder's side ------------------------------------------------------------------

    @property
    def used(self) -> int:
        return self.pool.used

    def short(self, row: int, tokens: int) -> int:
        """The pages `row` lacks to hold `tokens` tokens."""
        return max(0, pages_for(tokens) - len(self.pages[row]))

    def grow(self, row: int, tokens: int) -> None:
        """Give `row` the pages it lacks to hold `tokens` tokens; the caller made sure the
        pool has them."""
        held, lacking = len(self.pages[row]), self.short(row, tokens)
        if lacking:
            pages = self.pool.take(lacking)
            self.table[row, held:held + lacking] = torch.tensor(pages, dtype=torch.long)
            self.pages[row].extend(pages)

    def release(self, row: int) -> None:
        if self.pages[row]:
            self.pool.give(self.pages[row])
            self.table[row, :len(self.pages[row])] = 0
            self.pages[row] = []

    def reset(self) -> None:
        """Every row's pages back to the pool."""
        for row in range(len(self.pages)):
            self.release(row)

    def move(self, src: int, dst: int) -> None:
        """Row `src`'s pages become row `dst`'s (whose own went back first): no data moves."""
        held = len(self.pages[src])
        self.table[dst, :held] = self.table[src, :held]
        self.table[src, :held] = 0
        self.pages[dst], self.pages[src] = self.pages[src], []

    def for_prefill(self, rows: slice, positions: torch.Tensor, real: torch.Tensor) -> None:
        """The next forward writes prompts, (rows, width) left-padded at `real`, whose tokens
        lie at `positions`; pads write into page 0. They attend to themselves only."""
        table = self.table[rows]
        slots = table.gather(1, positions // PAGE_TOKENS) * PAGE_TOKENS + positions % PAGE_TOKENS
        self._write = slots.masked_fill_(~real, 0).reshape(-1)
        self._read = None

    def for_decode(self, n: int, positions: torch.Tensor, pages: int) -> None:
        """The next forward writes one token for rows 0..n-1 at `positions` (n,), and reads
        back their first `pages` pages (no row holds more)."""
        at = positions[:, None]
        page = self.table[:n].gather(1, at // PAGE_TOKENS)
        self._write = (page * PAGE_TOKENS + at % PAGE_TOKENS).reshape(-1)
        self._read = self.table[:n, :pages].reshape(-1)
        self._reads = (n, pages)
