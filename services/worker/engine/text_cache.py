"""The KV cache of continuous batching: one pool of pages, handed to rows as they grow.

Keys and values live in one (pages, PAGE_TOKENS, kv_heads, head_dim) tensor per layer each,
allocated once at load and sized by a memory budget (kv_budget.py), never past what the
model's own context needs for `rows` rows. A row holds the pages its tokens fill (its block
table: the token at position `p` of the row in batch row `i` lies in page
`table[i, p // PAGE_TOKENS]`), so 32 short rows fit where one full-context row does. Page 0 is
never a row's (page_pool.py): a block table's unused entries point at it.

Keys are stored after the model applied positions to them (GPT-2 adds position embeddings to
the input; rotary models rotate keys before caching), so where a token lies never changes what
it means: only the mask and the position ids decide attention.

It is handed to the model as its cache: the model calls `update` once per layer. A prefill
attends to its own keys, which `update` hands back as it got them, unless a row shares pages of
its prompt's beginning with other rows (prefix caching: `share_prefix`, page_pool.py): then it
computes only the rest of its prompt and reads its pages back as a decode step does. A decode
step attends to each row's pages, and how it reads them is what a CPU step's time depends on.
Each batch row has a home region, `region` pages in a row, and takes its pages there while they
are free (a row that moves into another batch row takes its pages' contents along, where that
one's home pages are free). While every running row holds only its home pages, the rows' keys
are one strided view of the pool, read in place as the old fixed slots were; otherwise (a
budget below `rows` full-context rows, a row grew past its region or took another's pages, or a
row shares pages) the step gathers each row's pages into one (rows, heads, pages x PAGE_TOKENS,
head_dim) buffer per layer. Measured in docs/architecture.md; on a GPU a paged-attention kernel
reads the block tables directly.
"""

from dataclasses import dataclass

import torch

from services.worker import metrics
from services.worker.engine.page_pool import PagePool

# Tokens per page: 16, vLLM's default block. Gathering 32 rows' pages of the 6x256 GPT-2's
# shape timed the same with pages of 32; smaller pages round a step's keys up less.
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
        self.model = model
        self.length = sizing.context
        self.row_pages = pages_for(sizing.context)
        token_bytes = 2 * shape.layers * shape.kv_heads * shape.head_dim * dtype.itemsize
        wanted = sizing.budget // (token_bytes * PAGE_TOKENS)
        # At least one full-context row, so that every row fits once it runs alone.
        usable = max(self.row_pages, min(wanted, sizing.rows * self.row_pages))
        self.pool = PagePool(usable + 1, model)
        self.region = usable // sizing.rows
        size = (usable + 1, PAGE_TOKENS, shape.kv_heads, shape.head_dim)
        self.keys = [torch.zeros(size, dtype=dtype, device=device) for _ in range(shape.layers)]
        self.values = [torch.zeros(size, dtype=dtype, device=device)
                       for _ in range(shape.layers)]
        heads, dim = shape.kv_heads, shape.head_dim
        pools = list(zip(self.keys, self.values, strict=True))
        # The same pools as tokens (writes), flat pages (gathers) and home regions (reads in
        # place: batch row i's region is pages 1 + i x region onwards).
        self._tokens = [(k.view(-1, heads, dim), v.view(-1, heads, dim)) for k, v in pools]
        self._pages = [(k.view(usable + 1, -1), v.view(usable + 1, -1)) for k, v in pools]
        homes = 1 + sizing.rows * self.region
        width = self.region * PAGE_TOKENS
        self._regions = [(k[1:homes].view(sizing.rows, width, heads, dim),
                          v[1:homes].view(sizing.rows, width, heads, dim)) for k, v in pools]
        self.table = torch.zeros((sizing.rows, self.row_pages), dtype=torch.long, device=device)
        self.pages: list[list[int]] = [[] for _ in range(sizing.rows)]
        self.home = [True] * sizing.rows  # the row holds only its home pages
        # Where batch row i's home region starts, in tokens: a home row's token at position
        # p lies at slot start + p.
        self._starts = torch.arange(1, 1 + sizing.rows * max(1, self.region),
                                    max(1, self.region), device=device) * PAGE_TOKENS
        self._in_place: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._in_place_reads = (0, 0)
        # What the next forward does: the token slots it writes, and whether it reads back
        # (rows, pages per row) in place, through a gather, or (a prefill of unshared prompts)
        # not at all; and its queries per row.
        self._write = torch.zeros(0, dtype=torch.long, device=device)
        self.reading = False
        self.decoding = False  # a decode step: one query a row
        self.in_place = False
        self._read = torch.zeros(0, dtype=torch.long, device=device)
        self._reads = (0, 0)
        self._queries = 1
        self._changed = True  # a block table changed since the last step's gather
        # Where a gathering step puts each layer's keys and values: reused by every layer,
        # grown when a step needs more; and the views of them the attention reads.
        self._gathered = [torch.zeros(0, dtype=dtype, device=device) for _ in range(2)]
        self._into: list[torch.Tensor] = []
        self._views: tuple[torch.Tensor, ...] = ()

    # The model's side --------------------------------------------------------------------

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self._tokens[layer_idx]
        keys.index_copy_(0, self._write, _tokens(key_states))
        values.index_copy_(0, self._write, _tokens(value_states))
        if not self.reading:
            return key_states, value_states
        if self.in_place:
            return self._in_place[layer_idx]
        for flat, into in zip(self._pages[layer_idx], self._into, strict=True):
            torch.index_select(flat, 0, self._read, out=into)
        return self._views[0], self._views[1]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Keys before this forward's: none for a prefill that attends to itself."""
        return self._reads[1] * PAGE_TOKENS - self._queries if self.reading else 0

    # The decoder's side ------------------------------------------------------------------

    @property
    def used(self) -> int:
        return self.pool.used

    def short(self, row: int, tokens: int) -> int:
        """The pages `row` lacks to hold `tokens` tokens."""
        return max(0, pages_for(tokens) - len(self.pages[row]))

    def grow(self, row: int, tokens: int) -> None:
        """Give `row` the pages it lacks to hold `tokens` tokens, its home pages where free;
        the caller made sure the pool has them."""
        held, lacking = len(self.pages[row]), self.short(row, tokens)
        if not lacking:
            return
        pages = []
        for j in range(held, held + lacking):
            home = self._home(row, j)
            if home is not None and self.pool.take(home):
                pages.append(home)
            else:
                pages.append(self.pool.take_any())
                self.home[row] = False
        self.table[row, held:held + lacking] = torch.tensor(pages, dtype=torch.long)
        self.pages[row].extend(pages)
        self._changed = True

    def share_prefix(self, digests: list[bytes]) -> tuple[list[int], int]:
        """The cached pages of the longest beginning of `digests` (prefix_pages.py), each now
        held once more; and how many of them no row held (they no longer count as free)."""
        pages, unheld = [], 0
        for digest in digests:
            page = self.pool.lookup(digest)
            if page is None:
                break
            unheld += self.pool.share(page)
            pages.append(page)
        return pages, unheld

    def attach(self, row: int, pages: list[int]) -> None:
        """Batch row `row`, which holds no pages, starts with shared `pages`."""
        if not pages:
            return
        self.table[row, :len(pages)] = torch.tensor(pages, dtype=torch.long)
        self.pages[row] = list(pages)
        self.home[row] = all(page == self._home(row, j) for j, page in enumerate(pages))
        self._changed = True

    def register(self, row: int, digests: list[bytes]) -> None:
        """Batch row `row`'s first pages hold the full pages `digests` name: other rows may
        share them from now on."""
        for page, digest in zip(self.pages[row], digests, strict=False):
            self.pool.register(page, digest)
        metrics.KV_PREFIX_CACHED.labels(self.model).set(self.pool.cached)

    def release(self, row: int) -> None:
        if self.pages[row]:
            self.pool.give(self.pages[row])
            self.table[row, :len(self.pages[row])] = 0
            self.pages[row] = []
            self._changed = True
        self.home[row] = True

    def reset(self) -> None:
        """Every row's pages back to the pool, which forgets what its pages held: a failed
        forward may have left any of them half written."""
        for row in range(len(self.pages)):
            self.release(row)
        self.pool.clear()
        metrics.KV_PREFIX_CACHED.labels(self.model).set(0)

    def move(self, src: int, dst: int) -> None:
        """Batch row `src`'s pages become row `dst`'s (whose own went back first): each one's
        contents move to `dst`'s home page where that is free, so reads stay in place (a
        cached page's content is then known there); pages other rows share stay where they
        are."""
        pages, moved, home = [], [], True
        for j, page in enumerate(self.pages[src]):
            target = self._home(dst, j)
            if (page != target and target is not None and self.pool.movable(page)
                    and self.pool.take(target)):
                moved.append((page, target))
                page = target
            home = home and page == target
            pages.append(page)
        if moved:
            sources = torch.tensor([s for s, _ in moved], device=self.table.device)
            targets = torch.tensor([t for _, t in moved], device=self.table.device)
            for k, v in zip(self.keys, self.values, strict=True):
                k.index_copy_(0, targets, k.index_select(0, sources))
                v.index_copy_(0, targets, v.index_select(0, sources))
            for s, t in moved:
                self.pool.moved(s, t)
        held = len(pages)
        self.table[dst, :held] = torch.tensor(pages, dtype=torch.long)
        self.table[src, :held] = 0
        self.pages[dst], self.pages[src] = pages, []
        self.home[dst], self.home[src] = home, True
        self._changed = True

    def for_prefill(self, rows: slice, positions: torch.Tensor, real: torch.Tensor,
                    pages: int = 0) -> None:
        """The next forward writes prompts, (rows, width) left-padded at `real`, whose tokens
        lie at `positions`; pads write into page 0. They attend to themselves only, or, with
        `pages`, to the rows' first `pages` pages (rows whose prompts begin in shared pages)."""
        table = self.table[rows]
        slots = table.gather(1, positions // PAGE_TOKENS) * PAGE_TOKENS + positions % PAGE_TOKENS
        self._write = slots.masked_fill_(~real, 0).reshape(-1)
        self.reading = bool(pages)
        self.decoding = False
        self.in_place = False
        if self.reading:
            self._queries = real.shape[1]
            self._gather(table[:, :pages], pages)
            self._changed = True  # the gathered pages are not the next decode step's

    def for_decode(self, positions: list[int], at: torch.Tensor, pages: int) -> None:
        """The next forward writes one token for rows 0..n-1 at `positions` (`at` on the
        device), and reads back their first `pages` pages (no row holds more). A step costs a
        small model a few tensor ops more than a fixed slot did, so what can be is kept from
        step to step, and the rest worked out on the host, which knows every row's pages."""
        n = len(positions)
        self.reading = self.decoding = True
        self._queries = 1
        self.in_place = all(self.home[:n])
        if self.in_place:
            self._write = self._starts[:n] + at
            if self._in_place_reads != (n, pages):
                width = pages * PAGE_TOKENS
                self._in_place = [(k[:n, :width].transpose(1, 2), v[:n, :width].transpose(1, 2))
                                  for k, v in self._regions]
                self._in_place_reads = (n, pages)
            self._reads = (n, pages)
            self._changed = True  # the gathered pages, if any, are not this step's
            return
        slots = [self.pages[i][p // PAGE_TOKENS] * PAGE_TOKENS + p % PAGE_TOKENS
                 for i, p in enumerate(positions)]
        self._write = torch.tensor(slots, dtype=torch.long).to(self.table.device,
                                                                non_blocking=True)
        if self._reads == (n, pages) and not self._changed:
            return  # the same pages as the step before
        self._changed = False
        self._gather(self.table[:n, :pages], pages)

    def _gather(self, table: torch.Tensor, pages: int) -> None:
        """The forward reads each of `table`'s rows' first `pages` pages, gathered."""
        n = table.shape[0]
        self._read = table.reshape(-1)
        self._reads = (n, pages)
        page = self._pages[0][0].shape[1]
        _, _, heads, dim = self.keys[0].shape
        self._into = [self._buffer(i, n * pages * page).view(n * pages, page) for i in range(2)]
        self._views = tuple(into.view(n, pages * PAGE_TOKENS, heads, dim).transpose(1, 2)
                            for into in self._into)

    def _home(self, row: int, index: int) -> int | None:
        """The home page of batch row `row`'s `index`th page, if its region has one."""
        return 1 + row * self.region + index if index < self.region else None

    def _buffer(self, i: int, numel: int) -> torch.Tensor:
        if self._gathered[i].numel() < numel:
            # Doubling, up to every row at full context: a few allocations at most.
            most = len(self.pages) * self.row_pages * self.keys[0][0].numel()
            grown = max(numel, min(2 * self._gathered[i].numel(), most))
            self._gathered[i] = torch.empty(grown, dtype=self.keys[0].dtype,
                                            device=self.keys[0].device)
        return self._gathered[i][:numel]


def _tokens(states: torch.Tensor) -> torch.Tensor:
    """(rows, heads, queries, head_dim) as (rows x queries, heads, head_dim): a view for a
    decode step's one query."""
    rows, heads, queries, dim = states.shape
    if queries == 1:
        return states[:, :, 0]
    return states.transpose(1, 2).reshape(rows * queries, heads, dim)
