"""What the engine feeds: the one interface between an engine and how its model's items are
scheduled onto the device.

Image models batch dynamically (batcher.py), text models decode continuously (decoder.py); the
engine holds one `Scheduling` and never asks which. Each item comes with a `Ticket`: how it may
be stopped and who hears about it.
"""

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from services.worker.engine.batch import Batch, ShouldStop
from services.worker.engine.results import Result
from services.worker.engine.start import OnBatch
from services.worker.engine.text_stream import OnText


@dataclass(frozen=True)
class Ticket:
    """How one item is run, apart from the item itself."""

    should_stop: ShouldStop | None = None  # its stop hook, polled between steps
    # Says, without counting a step, that it was stopped while still queued.
    withdrawn: Callable[[], bool] | None = None
    tag: str | None = None  # the sub-request it is, told to `on_start` (start.py)
    isolate: bool = False  # runs alone, with nothing beside it
    on_text: OnText | None = None  # hears a text item's text as it decodes; images have none
    charged: bool = False  # its attempt was charged with its lease already
    # Whose cached prompt pages it may share (text): only items of the same scope share.
    cache_scope: str = ""
    on_batch: OnBatch | None = None  # hears its batch as it starts on the device (start.py)


# An item with no stop hook, tag or listener, run in whatever company.
PLAIN = Ticket()


class Scheduling(Protocol):
    # Sub-requests on their way: taken from the queue, not yet submitted. A scheduler may
    # wait briefly for them, so that a burst runs together.
    expected: int

    def submit(self, item: Any, ticket: Ticket) -> asyncio.Future:
        """Queue an item; the future settles with its result, or what failed it."""

    def pump(self) -> None:
        """Something changed (an arrival, a withdrawal, an announced item that will not come):
        dispatch what is ready."""

    def starts_soon(self) -> bool:
        """Whether an item announced now would start on the device at the next iteration."""

    async def run_together(self, batch: Batch) -> list[Result]:
        """Run a batch's items together at once, outside the queue (tests, benchmarks,
        offline sampling); result i belongs to item i."""
