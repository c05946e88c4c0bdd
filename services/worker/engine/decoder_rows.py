"""A continuous decoder's rows (decoder.py): items waiting for a row slot or for KV-cache
pages, and rows running."""

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from services.worker.engine.batch import ShouldStop
from services.worker.engine.grammar_row import RowMatcher
from services.worker.engine.results import TextResult
from services.worker.engine.start import OnBatch
from services.worker.engine.text_cache import PAGE_TOKENS
from services.worker.engine.text_rows import Row, Sequence
from services.worker.engine.text_stream import OnText
from shared.messages import TextItem


@dataclass(eq=False)
class Waiting:
    item: TextItem
    should_stop: ShouldStop | None
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    arrived: float = field(default_factory=time.monotonic)
    withdrawn: Callable[[], bool] | None = None  # checked while waiting; never counts a step
    # Runs alone: it was in an iteration that failed, or on the device when a worker was lost.
    isolate: bool = False
    tag: str | None = None  # the sub-request it is (engine/start.py)
    charged: bool = False
    on_text: OnText | None = None  # hears its text after each read that advanced it
    cache_scope: str = ""  # shares cached prompt pages only within it (prefix_pages.py)
    on_batch: OnBatch | None = None  # hears the rows it starts with (start.py)
    # Its row, once started: held back for KV-cache pages, or preempted with the tokens it
    # made (its prompt and those are prefilled again when it is admitted).
    held: "Running | None" = None

    @property
    def gone(self) -> bool:
        return self.future.done() or (self.withdrawn is not None and self.withdrawn())


@dataclass(eq=False)
class Running:
    """A running row; its row in the batch (and in the cache's block tables) is its index in
    `Decoder.running`."""

    waiting: Waiting
    row: Row
    seq: Sequence
    columns: int = 0  # tokens in the cache: its positions 0..columns-1
    order: int = 0  # when it was admitted: the youngest row is preempted first
    fed: int = 0  # tokens made and not yet read back
    new: bool = True  # admitted this iteration: its first token came from the prefill
    stopped_at: int | None = None  # tokens it had made when asked to stop
    # Its prompt's full pages by content (prefix_pages.py), and the cached pages it holds
    # from admission to its prefill, where they become its first pages.
    digests: list[bytes] = field(default_factory=list)
    shared: list[int] = field(default_factory=list)
    # Its place in its `response_format`'s grammar: advanced past each token read.
    matcher: RowMatcher | None = None

    @property
    def stopped(self) -> bool:
        return self.stopped_at is not None

    @property
    def ids(self) -> list[int]:
        """What its prefill runs: its prompt, and the tokens it made before it was
        preempted."""
        return self.row.prompt + self.seq.generated

    @property
    def shareable(self) -> list[bytes]:
        """The digests of the pages it may take from the cache: never its last token's, so
        that its prefill computes at least the token it predicts from."""
        return self.digests[:(len(self.ids) - 1) // PAGE_TOKENS]

    @property
    def left(self) -> int:
        """Tokens it may still make, as far as the host knows."""
        return self.row.budget - self.seq.tokens - self.fed


Settle = tuple[Waiting, TextResult | None, BaseException | None]
