"""The stop hooks of a batch run together through a decoder (`Decoder.run_together`)."""

from collections.abc import Callable

from services.worker.engine.batch import Batch, ShouldStop


class RunStops:
    """Each item's own stop hook, and the batch's `stop_all`, which is asked once per decoder
    round however many rows it covers (`rounds` says which round it is)."""

    def __init__(self, batch: Batch, rounds: Callable[[], int]) -> None:
        self.batch, self._rounds = batch, rounds
        self.answers: dict[int, bool] = {}
        self.all_stopped = False

    def hook(self, i: int) -> ShouldStop:
        def should_stop() -> bool:
            if self._stop_all():
                return True
            own = self.batch.stops[i]
            if own is not None and own():
                self.batch.mark_stopped(i)
                return True
            return False

        return should_stop

    def _stop_all(self) -> bool:
        if self.batch.stop_all is None:
            return False
        rnd = self._rounds()
        if rnd not in self.answers:
            self.answers[rnd] = self.batch.stop_all()
        self.all_stopped |= self.answers[rnd]
        return self.answers[rnd]
