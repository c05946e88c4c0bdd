"""Text as it is decoded (engine/text_stream.py and the decoder's `on_text` hook): what is
heard after each read only ever grows, adds up to the final text exactly whatever ends the row,
never shows a stop string, and costs no host read."""

import asyncio
import random
from pathlib import Path

import pytest
import torch

from services.worker.engine import sync
from services.worker.engine.batch import Batch
from services.worker.engine.results import TextResult
from services.worker.engine.scheduling import Ticket
from services.worker.engine.stopped import PipelineStopped
from services.worker.engine.text_rows import Sequence
from services.worker.engine.text_stream import INCOMPLETE, TextUpdate, holdback, publishable
from services.worker.pipelines.text import CausalLMTextPipeline
from shared.messages import TextItem
from shared.registry import ModelKind, ModelSpec
from tests.worker.engine.test_decoder import PROMPTS, WORDS, HostReads, Loop
from tests.worker.engines import engine_for
from tests.worker.text_reference import alone, greedy_ids

MODEL = "tiny-gpt2-stream"  # a name of its own, so no other test moves its counters


@pytest.fixture(scope="module")
def pipeline(model_dir: Path) -> CausalLMTextPipeline:
    spec = ModelSpec(name=MODEL, kind=ModelKind.CAUSAL_LM, path=model_dir / "tiny-gpt2")
    pipe = CausalLMTextPipeline(spec, torch.device("cpu"))
    pipe.setup()
    return pipe


@pytest.fixture
def loop():
    lp = Loop()
    yield lp
    lp.close()


class Heard:
    """An `on_text` hook that takes the text at every read, as a streaming publisher does."""

    def __init__(self) -> None:
        self.updates: list[TextUpdate] = []
        self.texts: list[str] = []

    def __call__(self, update: TextUpdate) -> None:
        self.updates.append(update)
        self.texts.append(update.text())

    def deltas(self) -> list[str]:
        out, sent = [], ""
        for text in self.texts:
            assert text.startswith(sent), "published text was taken back"
            out.append(text[len(sent):])
            sent = text
        return out


def assert_streamed(heard: Heard, result: TextResult) -> None:
    assert "".join(heard.deltas()) == result.text
    *decoding, last = heard.updates
    assert all(u.finish_reason is None for u in decoding)
    assert (last.finish_reason, last.tokens, last.prompt_tokens) == (
        result.finish_reason, result.tokens, result.prompt_tokens)
    tokens = [u.tokens for u in heard.updates]
    assert tokens == sorted(set(tokens))  # once per read that advanced it
    assert not any(t.endswith(INCOMPLETE) for t in heard.texts[:-1])


def run(pipe: CausalLMTextPipeline, items: list[TextItem]) -> tuple[list, list[Heard]]:
    """The items decoded together, each with its own hook."""
    heard = [Heard() for _ in items]

    async def go():
        return await asyncio.gather(*(engine_for(pipe).scheduling.submit(item, Ticket(on_text=h))
                                      for item, h in zip(items, heard, strict=True)))

    return asyncio.run(go()), heard


def test_publishable_drops_an_incomplete_character_and_the_holdback():
    assert holdback([]) == 0 and holdback(["x", "abc"]) == 2
    assert publishable("naïve " + INCOMPLETE, 0) == "naïve "
    assert publishable("abcdef" + INCOMPLETE, 2) == "abcd"
    assert publishable("ab", 3) == ""
    # a replacement character the holdback cut leaves last waits for the next chunk
    assert publishable("ab" + INCOMPLETE + "cdef", 4) == "ab"


@pytest.mark.parametrize("stop", [[], ["😀"], [" ok", "z"]])
def test_a_sequence_streams_whole_characters_and_never_a_stop_string(
    pipeline: CausalLMTextPipeline, stop: list[str]
):
    text = "naïve €uro 😀 ok"
    ids = pipeline.tokenizer(text)["input_ids"]
    assert pipeline.eos_ids.isdisjoint(ids)
    seq = Sequence(item=TextItem(prompt="", max_new_tokens=len(ids), stop=stop),
                   budget=len(ids))
    streamed = []
    for token in ids:
        finished = seq.push(token, pipeline)
        streamed.append(seq.stream_text(pipeline))
        if finished:
            break
    cut = min((i for s in stop if (i := text.find(s)) >= 0), default=len(text))
    assert seq.text == text[:cut] == streamed[-1]
    for s in streamed:
        assert seq.text.startswith(s) and not s.endswith(INCOMPLETE)
        assert not any(x in s for x in stop)


def test_deltas_add_up_to_the_text_for_every_ending(pipeline: CausalLMTextPipeline,
                                                    monkeypatch: pytest.MonkeyPatch):
    (full,) = engine_for(pipeline).run([TextItem(prompt=PROMPTS[2], max_new_tokens=30)])
    stop = full.text[10:15]
    eos = greedy_ids(pipeline, PROMPTS[0], 4)[3]
    items = [
        TextItem(prompt=PROMPTS[1], max_new_tokens=17),
        TextItem(prompt=PROMPTS[2], max_new_tokens=30, stop=["never", stop]),
        TextItem(prompt=PROMPTS[0], max_new_tokens=30),  # ends at its 4th token, made an EOS
        TextItem(prompt=PROMPTS[4], max_new_tokens=1),
        TextItem(prompt=PROMPTS[5], max_new_tokens=23, temperature=0.9, seed=3, stop=["e"]),
    ]
    monkeypatch.setattr(pipeline, "eos_ids", pipeline.eos_ids | {eos})
    results, heard = run(pipeline, items)
    assert results == alone(pipeline, items)  # hearing the text changes nothing
    assert (results[0].finish_reason, results[0].tokens) == ("length", 17)
    assert results[1].finish_reason == "stop"
    assert results[1].text == full.text[:full.text.index(stop)]
    assert (results[2].finish_reason, results[2].tokens) == ("stop", 4)
    for h, result in zip(heard, results, strict=True):
        assert_streamed(h, result)
    assert all(stop not in t for t in heard[1].texts)


def test_rows_that_join_at_different_times_each_add_up(pipeline: CausalLMTextPipeline,
                                                      loop: Loop):
    rng = random.Random(4)
    stops = [[], ["e"], ["th", "x"], [" the"], ["zzzzzz"]]
    items = [
        TextItem(prompt=" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 10))),
                 max_new_tokens=rng.randint(1, 40), temperature=rng.choice([0, 0.9]), seed=i,
                 stop=rng.choice(stops))
        for i in range(16)
    ]
    reference = alone(pipeline, items)
    heard = [Heard() for _ in items]
    delays = [rng.random() * 0.2 for _ in items]
    engine = engine_for(pipeline)

    async def staggered():
        async def one(item, hook, delay):
            await asyncio.sleep(delay)
            return await engine.submit(item, Ticket(on_text=hook))

        return await asyncio.gather(*(one(*a) for a in zip(items, heard, delays, strict=True)))

    results = loop.run(staggered())
    assert results == reference
    for h, result, item in zip(heard, results, items, strict=True):
        assert_streamed(h, result)
        assert not any(s in t for s in item.stop for t in h.texts)


def test_streaming_adds_no_host_read(pipeline: CausalLMTextPipeline):
    items = [TextItem(prompt=p, max_new_tokens=5 + 3 * i, stop=["e"] if i % 2 else [])
             for i, p in enumerate(PROMPTS)]
    before = sync.count(MODEL)
    quiet = engine_for(pipeline).run(items)
    reads = sync.count(MODEL) - before

    decoder = engine_for(pipeline).scheduling
    staging = decoder.tokens_host.untyped_storage().data_ptr()
    mode = HostReads()
    original = decoder._iterate

    def iterate(admit):  # on the device thread, where the hooks are called too
        with mode:
            return original(admit)

    decoder._iterate = iterate
    before = sync.count(MODEL)
    try:
        results, heard = run(pipeline, items)
    finally:
        del decoder._iterate
    assert results == quiet and all(h.updates for h in heard)
    assert sync.count(MODEL) - before == reads
    converted = [(name, t.untyped_storage().data_ptr()) for name, t in mode.seen]
    assert converted == [("tolist", staging)] * reads


def test_a_row_asked_to_stop_hears_nothing_more(pipeline: CausalLMTextPipeline):
    items = [TextItem(prompt=p, max_new_tokens=20) for p in PROMPTS[:2]]
    calls = 0

    def stop_later() -> bool:
        nonlocal calls
        calls += 1
        return calls >= 8  # the prefill and a whole read first, then in the second read

    heard = [Heard() for _ in items]

    async def go():
        batch = Batch(items, [None, stop_later])
        return await asyncio.gather(
            *(engine_for(pipeline).scheduling.submit(item, Ticket(should_stop=stop, on_text=h))
              for item, stop, h in zip(items, batch.stops, heard, strict=True)),
            return_exceptions=True)

    done, stopped = asyncio.run(go())
    assert isinstance(stopped, PipelineStopped)
    partial = stopped.partial
    assert partial.finish_reason == "canceled" and partial.prompt_tokens == len(
        pipeline.tokenizer(PROMPTS[1])["input_ids"])
    assert heard[1].updates, "it was heard before it stopped"
    assert all(u.finish_reason is None and u.tokens < partial.tokens for u in heard[1].updates)
    assert_streamed(heard[0], done)
