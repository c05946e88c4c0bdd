"""Output events of text sub-requests (services/worker/progress.py), heard on the job's real
Redis channel: every read when the item streams, throttled from the start otherwise, in order,
and nothing more once the row was asked to stop; the final event is kept for the script that
stores the result (tests/shared/test_jobstore.py hears it published there)."""

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from services.worker import progress
from services.worker.engine.scheduling import Ticket
from services.worker.engine.text_stream import TextUpdate
from services.worker.flights import InFlight
from services.worker.outbox import EventOutbox
from services.worker.pipelines.text import CausalLMTextPipeline
from services.worker.progress import ProgressPublisher, TextPublisher
from shared import names
from shared.messages import FinishReason, OutputData, OutputEvent, StopReason, SubRequest, TextItem
from shared.registry import ModelKind, ModelSpec
from tests.worker.engines import engine_for

FINAL = FinishReason.LENGTH


@pytest.fixture(scope="module")
def pipeline(model_dir: Path) -> CausalLMTextPipeline:
    spec = ModelSpec(name="tiny-gpt2-progress", kind=ModelKind.CAUSAL_LM,
                     path=model_dir / "tiny-gpt2")
    pipe = CausalLMTextPipeline(spec, torch.device("cpu"))
    pipe.setup()
    return pipe


def _flight(index: int = 0, stream: bool = False, max_new_tokens: int = 50) -> InFlight:
    item = TextItem(prompt="Hello", max_new_tokens=max_new_tokens, stream=stream)
    sub = SubRequest(job_id="j1", index=index, model="tiny-gpt2", item=item)
    return InFlight(sub, time.time() + 60)


def _publisher(aredis) -> ProgressPublisher:
    return ProgressPublisher(EventOutbox(aredis, asyncio.get_running_loop()))


def _update(text: str, tokens: int, final: bool = False) -> TextUpdate:
    return TextUpdate(tokens=tokens, prompt_tokens=3, finish_reason=FINAL if final else None,
                      text=lambda: text)


class Channel:
    """The job's events channel, subscribed before anything is published."""

    def __init__(self, aredis) -> None:
        self.pubsub = aredis.pubsub(ignore_subscribe_messages=True)

    async def __aenter__(self) -> "Channel":
        await self.pubsub.subscribe(names.events_channel("j1"))
        return self

    async def __aexit__(self, *exc) -> None:
        await self.pubsub.aclose()

    async def outputs(self, count: int, timeout: float = 10) -> list[OutputData]:
        """The next `count` output events."""
        got: list[OutputData] = []
        async with asyncio.timeout(timeout):
            while len(got) < count:
                msg = await self.pubsub.get_message(timeout=1)
                if msg is not None:
                    got.append(OutputEvent.decode(msg["data"]).data)
        return got

    async def heard(self, seconds: float) -> list[OutputData]:
        """Every output event heard within `seconds`."""
        got: list[OutputData] = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            msg = await self.pubsub.get_message(timeout=left)
            if msg is not None:
                got.append(OutputEvent.decode(msg["data"]).data)
        return got


async def _on_device(hook: Callable[[TextUpdate], None], updates: list[TextUpdate]) -> None:
    """Call the hook from another thread, as the decoder does from the device thread."""
    await asyncio.to_thread(lambda: [hook(u) for u in updates])


def _final(hook: TextPublisher) -> OutputData:
    assert hook.final is not None, "the row ended without a final event"
    return OutputEvent.decode(hook.final).data


async def test_a_streamed_item_publishes_every_read_in_order(aredis):
    hook = _publisher(aredis).text_hook(_flight(stream=True))
    text = "".join(chr(ord("a") + i % 26) for i in range(200))
    updates = [_update(text[:i], i) for i in range(1, 200)] + [_update(text, 200, final=True)]
    async with Channel(aredis) as channel:
        await _on_device(hook, updates)
        got = await channel.outputs(199)
        assert await channel.heard(0.2) == []  # the final one is kept for the result
    assert [d.text for d in got] == list(text[:199])  # one per read, none crossed another
    assert [d.tokens for d in got] == list(range(1, 200))
    assert all(d.finish_reason is None and d.prompt_tokens is None for d in got)
    final = _final(hook)
    assert (final.text, final.offset, final.tokens) == (text[199], 199, 200)
    assert (final.finish_reason, final.prompt_tokens) == (FINAL, 3)


async def test_without_stream_events_are_throttled_from_the_start(
    aredis, monkeypatch: pytest.MonkeyPatch
):
    now = 0.0
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: now))
    hook = _publisher(aredis).text_hook(_flight())
    async with Channel(aredis) as channel:
        for at, update in [(0.01, _update("He", 2)), (0.05, _update("Hel", 3)),
                           (0.1, _update("", 4)),  # a character still incomplete: nothing
                           (0.11, _update("Hell", 5)), (0.15, _update("Hello", 6)),
                           (0.211, _update("Hello,", 7)), (0.25, _update("Hello, w", 8, True))]:
            now = at
            await _on_device(hook, [update])
        got = await channel.outputs(2)
        assert await channel.heard(0.2) == []
    # Nothing in the first interval; then at most one event per interval, the text adding up.
    assert [(d.text, d.tokens) for d in got] == [("Hell", 5), ("o,", 7)]
    final = _final(hook)
    assert (final.text, final.offset, final.tokens, final.finish_reason) == (" w", 6, 8, FINAL)


async def test_a_short_row_publishes_nothing_and_keeps_its_whole_text_for_the_result(
    aredis, monkeypatch: pytest.MonkeyPatch
):
    # Short: it ends within its first interval, however slow the machine running the test.
    monkeypatch.setattr(progress, "MIN_INTERVAL_SECONDS", 3600)
    hook = _publisher(aredis).text_hook(_flight())
    async with Channel(aredis) as channel:
        await _on_device(hook, [_update("ab", 1), _update("abc", 2), _update("abc", 3, True)])
        await hook.flushed()
        assert await channel.heard(0.2) == []
    final = _final(hook)
    assert (final.text, final.offset, final.tokens, final.finish_reason) == ("abc", 0, 3, FINAL)


async def test_a_job_nobody_watches_publishes_nothing_until_a_stream_opens(aredis):
    """Unwatched, nothing is made; once a stream watches the job, its first event holds the
    text from the start (offset 0), and the final one the rest."""
    flight = _flight(stream=True)
    flight.watched = False
    hook = _publisher(aredis).text_hook(flight)
    steps = _publisher(aredis).hook(flight)
    async with Channel(aredis) as channel:
        await _on_device(hook, [_update("a", 1), _update("ab", 2)])
        await asyncio.to_thread(steps)
        await hook.flushed()
        assert await channel.heard(0.2) == []
        flight.watched = True
        await _on_device(hook, [_update("abc", 3), _update("abcd", 4, True)])
        await hook.flushed()
        got = await channel.heard(0.3)
    assert [(d.text, d.offset) for d in got] == [("abc", 0)]
    final = _final(hook)
    assert (final.text, final.offset) == ("d", 3)


async def test_a_row_asked_to_stop_publishes_nothing_more(aredis):
    flight = _flight(stream=True)
    hook = _publisher(aredis).text_hook(flight)
    async with Channel(aredis) as channel:
        await _on_device(hook, [_update("a", 1), _update("ab", 2)])
        await hook.flushed()
        flight.request_stop(StopReason.CANCELED)
        await _on_device(hook, [_update("abc", 3), _update("abcd", 4)])
        await hook.flushed()
        got = await channel.heard(0.3)
    assert [d.text for d in got] == ["a", "b"]


async def test_decoded_rows_publish_texts_that_add_up(aredis, pipeline: CausalLMTextPipeline):
    """The real decoder calls the hooks on its device thread: the streamed row is heard at
    every read; with its final event (kept for the result) each row's events add up to its
    text."""
    publisher = _publisher(aredis)
    flights = [_flight(0, stream=True, max_new_tokens=40), _flight(1, max_new_tokens=40)]
    hooks = [publisher.text_hook(f) for f in flights]
    reads = 0

    def counting(update: TextUpdate) -> None:
        nonlocal reads
        reads += 1
        hooks[0](update)

    engine = engine_for(pipeline)
    async with Channel(aredis) as channel:
        results = await asyncio.gather(
            engine.submit(flights[0].sub.item, Ticket(on_text=counting)),
            engine.submit(flights[1].sub.item, Ticket(on_text=hooks[1])))
        for hook in hooks:
            await hook.flushed()
        got = await channel.heard(0.3)
    assert results[0] == results[1]  # the same item: greedy
    for index, result in enumerate(results):
        events = [d for d in got if d.index == index] + [_final(hooks[index])]
        assert "".join(d.text for d in events) == result.text
        assert [d.finish_reason for d in events].count(None) == len(events) - 1
        last = events[-1]
        assert (last.finish_reason, last.tokens, last.prompt_tokens) == (
            result.finish_reason, result.tokens, result.prompt_tokens)
    streamed = [d for d in got if d.index == 0]
    assert len(streamed) + 1 == reads  # every read made new text here; the last is the final
    assert len([d for d in got if d.index == 1]) <= len(streamed)  # throttled, never more


async def test_streamed_log_probabilities_add_up_to_the_results(
        aredis, pipeline: CausalLMTextPipeline):
    publisher = _publisher(aredis)
    item = TextItem(prompt="Hello", max_new_tokens=30, stream=True, logprobs=1)
    flight = InFlight(SubRequest(job_id="j1", index=0, model="tiny-gpt2", item=item),
                      time.time() + 60)
    hook = publisher.text_hook(flight)
    async with Channel(aredis) as channel:
        result = await engine_for(pipeline).submit(item, Ticket(on_text=hook))
        await hook.flushed()
        got = await channel.heard(0.3)
    events = [*got, _final(hook)]
    assert len(got) >= 2  # streamed over several reads
    assert [e for d in events for e in d.logprobs or []] == result.logprobs
