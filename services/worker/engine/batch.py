"""Per-batch state: what one run of a pipeline graph owns, apart from the read-only pipeline.

A batch holds its items, one stop hook per item, the buffer leases it took (returned when the
batch ends, whatever way it ends) and the items that stopped early. An item that stops is
reported at once through `on_stop`, so its sub-request can end (and free its job lease) while
the rest of its batch runs on; the batch itself stops when every item has.
"""

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack
from typing import Any

from services.worker.engine.stopped import PipelineStopped

# Called between denoise / decode steps; True asks for the item to stop.
ShouldStop = Callable[[], bool]


class Batch:
    def __init__(
        self,
        items: Sequence[Any],
        stops: Sequence[ShouldStop | None] | None = None,
        on_stop: Callable[[int], None] | None = None,
        stop_all: ShouldStop | None = None,
    ) -> None:
        self.items = list(items)
        self.stops = list(stops) if stops is not None else [None] * len(self.items)
        if len(self.stops) != len(self.items):
            raise ValueError("one stop hook per item")
        self.stopped = [False] * len(self.items)
        self._on_stop = on_stop
        self.stop_all = stop_all
        self._leases = ExitStack()
        self.closed = False

    def __len__(self) -> int:
        return len(self.items)

    def hold(self, lease: AbstractContextManager) -> Any:
        """Enter a lease for the rest of the batch; it is returned when the batch closes. A
        batch that has closed takes no more: the lease goes back at once."""
        if self.closed:
            with lease:
                pass
            raise PipelineStopped
        return self._leases.enter_context(lease)

    def close(self) -> None:
        self.closed = True
        self._leases.close()

    def check_stops(self) -> None:
        """Poll every running item's stop hook once (call between steps).

        Raises PipelineStopped when no item is left running, or `stop_all` asks for it.
        """
        if self.stop_all is not None and self.stop_all():
            raise PipelineStopped
        for i, stop in enumerate(self.stops):
            if not self.stopped[i] and stop is not None and stop():
                self.mark_stopped(i)
        if all(self.stopped):
            raise PipelineStopped

    def mark_stopped(self, i: int) -> None:
        """Item i stopped early: report it at once."""
        self.stopped[i] = True
        if self._on_stop is not None:
            self._on_stop(i)
