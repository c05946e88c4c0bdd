"""Live progress of a running sub-request, published for the job's live event stream.

Steps: pipelines call their `should_stop` hook once between denoise or decode steps; that
boundary is also where progress is counted, so this hook does both. Text: the decoder hands a
text sub-request's `on_text` hook (`TextPublisher`) its row after every read of the tokens, and
the new text goes out as `output` events. Publishing is fire-and-forget and throttled to one
event per `MIN_INTERVAL_SECONDS` from the sub-request's start (an item that asked for `stream`
gets its text at every read): a slow Redis never slows the device thread, and a short
sub-request costs no publish at all (the job's `running` status event already shows it
started); nor does one whose job no live stream watches (`InFlight.watched`). Events go out
through the runtime's `EventOutbox`, gathered into pipelines. A text's final `output` event
is not published here but by the script that stores its result (`TextPublisher.final`), in
the same round trip.
"""

import asyncio
import time

from services.worker.engine.batch import ShouldStop
from services.worker.engine.text_stream import TextUpdate
from services.worker.flights import InFlight
from services.worker.outbox import EventOutbox
from shared import names
from shared.messages import ImageItem, OutputData, OutputEvent, StepData, StepEvent, TextItem

MIN_INTERVAL_SECONDS = 0.1
# The longest a finished text sub-request waits for its output events to be published before
# its result is stored (which may make the job final and end its event streams).
FLUSH_SECONDS = 1.0


class ProgressPublisher:
    def __init__(self, outbox: EventOutbox) -> None:
        self.outbox = outbox  # hooks are called from the device thread

    def hook(self, flight: InFlight) -> ShouldStop:
        sub = flight.sub
        total = sub.item.steps if isinstance(sub.item, ImageItem) else sub.item.max_new_tokens
        channel = names.events_channel(sub.job_id)
        last_sent = time.monotonic()

        def should_stop() -> bool:
            nonlocal last_sent
            flight.steps += 1
            now = time.monotonic()
            if flight.watched and now - last_sent >= MIN_INTERVAL_SECONDS:
                last_sent = now
                event = StepEvent(data=StepData(index=sub.index, step=min(flight.steps, total),
                                                steps=total))
                self.outbox.put(channel, event.encode())
            return flight.stop.is_set()

        return should_stop

    def text_hook(self, flight: InFlight) -> "TextPublisher":
        """The `on_text` hook of a text sub-request (engine/engine.py)."""
        return TextPublisher(self.outbox, flight)


class TextPublisher:
    """Publishes a text sub-request's new text as `output` events: at every read that made
    some when its item asked for `stream` (flushed at once: a client is waiting on it),
    otherwise at most once per `MIN_INTERVAL_SECONDS` (the text adds up in between). Its final
    event (the rest of the text, finish_reason, prompt_tokens) is kept as `final` for the
    handler to store with the result; a row asked to stop publishes nothing more. The outbox
    publishes events in the order they were handed over, so an index's events never cross."""

    def __init__(self, outbox: EventOutbox, flight: InFlight) -> None:
        self.outbox, self.flight = outbox, flight
        self.channel = names.events_channel(flight.sub.job_id)
        item = flight.sub.item
        self.every_read = isinstance(item, TextItem) and item.stream
        self.sent = 0  # characters published so far
        self.scored = 0  # tokens whose log-probabilities were published so far
        self.last_sent = time.monotonic()
        self.final: str | None = None  # the encoded final event, once the row has ended
        self._handed = False  # some event went to the outbox

    def __call__(self, update: TextUpdate) -> None:
        """On the device thread, after a read that advanced the row."""
        final = update.finish_reason is not None
        now = time.monotonic()
        if not final:
            # Nobody watches (yet): nothing is made, and a stream that opens later gets the
            # text from its start in its first event.
            if self.flight.stop.is_set() or not self.flight.watched:
                return
            if not (self.every_read or now - self.last_sent >= MIN_INTERVAL_SECONDS):
                return
        text = update.text()
        if len(text) <= self.sent and not final:
            return
        logprobs = None
        if update.logprobs is not None:
            logprobs = update.logprobs[self.scored:]
            self.scored = len(update.logprobs)
        data = OutputData(index=self.flight.sub.index, text=text[self.sent:], offset=self.sent,
                          tokens=update.tokens,
                          finish_reason=update.finish_reason,
                          prompt_tokens=update.prompt_tokens if final else None,
                          logprobs=logprobs)
        self.sent, self.last_sent = len(text), now
        if final:
            self.final = OutputEvent(data=data).encode()
            return
        self.outbox.put(self.channel, OutputEvent(data=data).encode(), urgent=self.every_read)
        self._handed = True

    async def flushed(self, timeout: float = FLUSH_SECONDS) -> None:
        """Wait (at most `timeout`) until the events handed over so far are published, so that
        they are on the job's channel before the final one and the result that may make the
        job final."""
        if self._handed:
            await asyncio.wait([asyncio.ensure_future(self.outbox.flush())], timeout=timeout)
