"""Continuous batching for text: rows join and leave between steps, a paged KV cache, one
counted host read per iteration, tokens equal to `generate` and to each item run alone."""

import asyncio
import math
import random
import threading
import time
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from services.worker.engine import decoder as decoder_module
from services.worker.engine import sync, text_cache
from services.worker.engine.batch import Batch
from services.worker.engine.decoder import STEPS_PER_READ, Decoder
from services.worker.engine.decoder_rows import Waiting
from services.worker.engine.engine import Engine
from services.worker.engine.growth import GrowthEstimate
from services.worker.engine.scheduling import Ticket
from services.worker.engine.stopped import PipelineStopped
from services.worker.engine.text_cache import PAGE_TOKENS, pages_for
from services.worker.pipelines.text import CausalLMTextPipeline
from shared.errors import ContextLengthExceeded
from shared.messages import TextItem
from shared.registry import ModelKind, ModelSpec
from tests.worker.engines import engine_for
from tests.worker.text_reference import alone, greedy_ids

MODEL = "tiny-gpt2-decoder"  # a name of its own, so no other test moves its counters
PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog, and then",
    "Return a new list of the items",
    "If the",
    "This function",
    "Return True if",
    "A",
    "Split the string at every comma",
]
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "then",
         "some", "more"]


def _pipeline(model_dir: Path, name: str = MODEL, **spec) -> CausalLMTextPipeline:
    spec = ModelSpec(name=name, kind=ModelKind.CAUSAL_LM, path=model_dir / "tiny-gpt2", **spec)
    pipe = CausalLMTextPipeline(spec, torch.device("cpu"))
    pipe.load()
    pipe.prepare()
    return pipe


@pytest.fixture(scope="module")
def pipeline(model_dir: Path) -> CausalLMTextPipeline:
    return _pipeline(model_dir)  # max_batch 8: eight slots


class Loop:
    """An event loop on its own thread, as the worker runs its engines."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 120):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def loop():
    lp = Loop()
    yield lp
    lp.close()


def random_items(n: int, seed: int, max_tokens: int = 30) -> list[TextItem]:
    rng = random.Random(seed)
    return [
        TextItem(prompt=" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))),
                 max_new_tokens=rng.randint(1, max_tokens), temperature=rng.choice([0, 0, 0.9]),
                 seed=i)
        for i in range(n)
    ]


def test_the_pool_is_preallocated_no_larger_than_the_context_needs(
        pipeline: CausalLMTextPipeline):
    cache = engine_for(pipeline).scheduling.cache
    config = pipeline.model.config
    # The CPU's 4 GiB default holds far more than 8 rows (max_batch) at 1,024 positions.
    assert cache.length == config.n_positions
    assert cache.pool.total == 8 * 1024 // PAGE_TOKENS
    head_dim = config.n_embd // config.n_head
    page = (cache.pool.total + 1, PAGE_TOKENS, config.n_head, head_dim)  # and page 0
    assert [tuple(k.shape) for k in cache.keys] == [page] * 2


def test_greedy_equals_generate_token_for_token(pipeline: CausalLMTextPipeline):
    for prompt in PROMPTS:
        ids = pipeline.tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            out = pipeline.model.generate(ids, attention_mask=torch.ones_like(ids),
                                          max_new_tokens=20, min_new_tokens=20,
                                          do_sample=False, pad_token_id=pipeline.pad_id)
        expected = out[0, ids.shape[1]:].tolist()
        assert pipeline.eos_ids.isdisjoint(expected)
        (result,) = engine_for(pipeline).run([TextItem(prompt=prompt, max_new_tokens=20)])
        assert (result.text, result.tokens) == (pipeline.decode(expected), 20)


@pytest.mark.parametrize("n", [1, 5])
def test_one_counted_host_read_per_iteration(pipeline: CausalLMTextPipeline, n: int) -> None:
    budgets = [20, 7, 13, 20, 3][:n]
    items = [
        TextItem(prompt=p, max_new_tokens=b, temperature=0.9 * (i % 2), seed=i)
        for i, (p, b) in enumerate(zip(PROMPTS, budgets, strict=False))
    ]
    total, outputs = sync.count(MODEL), sync.count(MODEL, "output")
    results = engine_for(pipeline).run(items)
    assert [r.tokens for r in results] == budgets  # the tiny model never emits its EOS here
    reads = sync.count(MODEL) - total
    assert reads == sync.count(MODEL, "output") - outputs  # every read is the tokens' read
    # Iterations end where a row reaches its budget or after STEPS_PER_READ steps.
    assert reads <= 1 + math.ceil((max(budgets) - 1) / STEPS_PER_READ) + len(set(budgets))


class HostReads(TorchFunctionMode):
    """Every conversion of a tensor to a Python value, with the tensor converted."""

    NAMES = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "cpu"}

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, torch.Tensor]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.NAMES and args and isinstance(args[0], torch.Tensor):
            self.seen.append((name, args[0]))
        return func(*args, **(kwargs or {}))


def test_the_only_host_reads_are_the_counted_ones(pipeline: CausalLMTextPipeline) -> None:
    items = random_items(12, seed=3)
    decoder = engine_for(pipeline).scheduling
    staging = decoder.tokens_host.untyped_storage().data_ptr()
    before = sync.count(MODEL)
    mode = HostReads()

    # Inside the device thread, where the model and the decoder run.
    def iterate(admit):
        with mode:
            return original(admit)

    original = decoder._iterate
    decoder._iterate = iterate
    try:
        results = engine_for(pipeline).run(items)
    finally:
        del decoder._iterate
    reads = sync.count(MODEL) - before
    assert results == alone(pipeline, items)
    converted = [(name, t.untyped_storage().data_ptr()) for name, t in mode.seen]
    # Only the staging buffer the counted copy filled is ever turned into Python values,
    # once per counted read; nothing in the model's code reads the device.
    assert converted == [("tolist", staging)] * reads


def test_rows_join_and_leave_between_steps(pipeline: CausalLMTextPipeline, loop: Loop):
    long = TextItem(prompt=PROMPTS[1], max_new_tokens=200)
    shorts = [TextItem(prompt=p, max_new_tokens=3) for p in PROMPTS[2:5]]
    reference = alone(pipeline, [long, *shorts])
    engine = engine_for(pipeline)

    async def scenario():
        long_future = asyncio.ensure_future(engine.submit(long))
        while not engine_for(pipeline).scheduling.running:  # the long row is decoding
            await asyncio.sleep(0.001)
        short_results = await asyncio.gather(*(engine.submit(s) for s in shorts))
        # They joined the running batch and left it while the long row went on.
        assert not long_future.done()
        return [await long_future, *short_results]

    assert loop.run(scenario()) == reference


def test_a_decode_step_reads_only_the_columns_its_rows_hold(
    pipeline: CausalLMTextPipeline, loop: Loop, monkeypatch: pytest.MonkeyPatch
):
    # A row that joins late keeps decoding after the early one left: the shared column is
    # then far past the late row's first column, and the step reads only the late row's.
    early = TextItem(prompt=PROMPTS[1], max_new_tokens=120)
    late = TextItem(prompt=PROMPTS[5], max_new_tokens=150)
    reference = alone(pipeline, [early, late])
    assert [r.tokens for r in reference] == [120, 150]  # no EOS: the scenario below holds
    decoder = engine_for(pipeline).scheduling
    reads = []  # (keys read, rows, the pages of the longest row's tokens, this one's too)
    update = text_cache.PagedCache.update

    def recording(self, key_states, value_states, layer_idx, *args, **kwargs):
        keys, values = update(self, key_states, value_states, layer_idx, *args, **kwargs)
        if layer_idx == 0 and self.decoding:  # a decode step
            reads.append((keys.shape[2], len(decoder.running),
                          pages_for(max(r.columns for r in decoder.running) + 1)))
        return keys, values

    monkeypatch.setattr(text_cache.PagedCache, "update", recording)
    engine = engine_for(pipeline)

    async def scenario():
        joined = loop.loop.create_future()

        def on_text(update) -> None:  # on the device thread: the late row joins mid-way
            if update.tokens >= 24 and not joined.done():
                loop.loop.call_soon_threadsafe(
                    lambda: joined.done() or joined.set_result(
                        asyncio.ensure_future(engine.submit(late))))

        first = await engine.submit(early, Ticket(on_text=on_text))
        return [first, await (await joined)]

    assert loop.run(scenario()) == reference
    assert all(read == pages * PAGE_TOKENS for read, _, pages in reads)
    # Once the early row has left, the late one reads its own pages only.
    alone_reads = [read for read, rows, _ in reads if rows == 1]
    assert alone_reads and min(alone_reads) < 120


def test_a_full_pool_makes_rows_wait(model_dir: Path, loop: Loop):
    pipe = _pipeline(model_dir, name="tiny-gpt2-two-slots", max_batch=2)
    items = random_items(9, seed=5)
    reference = alone(pipe, items)
    decoder = engine_for(pipe).scheduling
    pointers = [t.data_ptr() for t in decoder.cache.keys]
    most = 0
    original = decoder._iterate

    def iterate(admit):
        nonlocal most
        most = max(most, len(decoder.running) + len(admit))
        return original(admit)

    decoder._iterate = iterate
    engine = engine_for(pipe)

    async def burst():
        return await asyncio.gather(*(engine.submit(it) for it in items))

    assert loop.run(burst()) == reference
    assert most == 2  # never more rows than slots, and the slots were used
    assert [t.data_ptr() for t in decoder.cache.keys] == pointers  # nothing was reallocated


def _page_bytes(pipe: CausalLMTextPipeline) -> int:
    config = pipe.model.config
    return 2 * config.n_layer * PAGE_TOKENS * config.n_embd * 4  # keys and values, float32


def test_staggered_arrivals_through_preemption_match_alone(model_dir: Path, loop: Loop):
    # A pool of 4 pages for 4 rows of up to 48 tokens (3 pages each): rows wait for pages,
    # and running rows that need one push the youngest out, to be recomputed later, as the
    # arrival times have it (test_kv_pages.py builds each case for sure).
    spec = {"max_batch": 4, "kv_cache_bytes": 4 * 16 * 1024}
    pipe = _pipeline(model_dir, name="tiny-gpt2-short-cache", max_context=48, **spec)
    assert 4 * _page_bytes(pipe) == spec["kv_cache_bytes"]
    items = random_items(40, seed=1, max_tokens=24)  # each within a row's 48 tokens
    reference = alone(pipe, items)
    engine = engine_for(pipe)
    # Admitted on their prompts alone, so that running rows do push the youngest out.
    engine.scheduling.growth = GrowthEstimate(ratio=0.0, floor=0.0, step=0.0)
    rng = random.Random(2)
    delays = [rng.random() * 0.3 for _ in items]

    async def staggered():
        async def one(item, delay):
            await asyncio.sleep(delay)
            return await engine.submit(item)

        return await asyncio.gather(*(one(it, d) for it, d in zip(items, delays, strict=True)))

    got = loop.run(staggered())
    # Arrival times decide which rows share a step; every row, sampled ones too, must still
    # give its tokens alone: these items' seeded draws lie at least 1e-5 from a boundary
    # between two tokens, far beyond what the batch's rounding moves (engine/decoder.py).
    differ = [i for i, (a, b) in enumerate(zip(got, reference, strict=True)) if a != b]
    assert differ == []
    assert engine.scheduling.cache.used == 0


def test_stopped_item_leaves_the_rest_running(pipeline: CausalLMTextPipeline) -> None:
    items = [TextItem(prompt=p, max_new_tokens=12) for p in PROMPTS[:3]]
    calls = 0

    def stop_second() -> bool:
        nonlocal calls
        calls += 1
        return calls >= 3  # asked before prefill, step 1, then stops before step 2

    stopped: list[int] = []
    batch = Batch(items, [None, stop_second, None], on_stop=stopped.append)
    results = asyncio.run(engine_for(pipeline).run_async(batch))
    assert stopped == [1]
    assert results[1].finish_reason == "canceled" and results[1].tokens == 2
    assert [results[0], results[2]] == alone(pipeline, [items[0], items[2]])
    assert not engine_for(pipeline).scheduling.running


def test_a_model_error_fails_the_rows_it_held_and_the_decoder_goes_on(
    pipeline: CausalLMTextPipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = [TextItem(prompt=p, max_new_tokens=10) for p in PROMPTS[:3]]

    def boom(*args, **kwargs):
        raise RuntimeError("injected")

    with monkeypatch.context() as m:
        m.setattr(pipeline, "forward", boom)
        with pytest.raises(RuntimeError, match="injected"):
            engine_for(pipeline).run(items)
    decoder = engine_for(pipeline).scheduling
    assert not decoder.running and decoder.cache.used == 0
    assert engine_for(pipeline).run(items) == alone(pipeline, items)


def test_batch_of_8_greedy_matches_alone(pipeline: CausalLMTextPipeline) -> None:
    items = [TextItem(prompt=p, max_new_tokens=4 + 2 * i) for i, p in enumerate(PROMPTS)]
    batched = engine_for(pipeline).run(items)
    assert batched == alone(pipeline, items)
    assert [r.tokens for r in batched] == [4 + 2 * i for i in range(8)]


def test_single_tokens_take_no_decode_step(pipeline: CausalLMTextPipeline,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    steps = 0
    step = Decoder._step

    def counting(self, *args):
        nonlocal steps
        steps += 1
        return step(self, *args)

    monkeypatch.setattr(Decoder, "_step", counting)
    items = [TextItem(prompt=p, max_new_tokens=1) for p in PROMPTS[:3]]
    results = engine_for(pipeline).run(items)
    assert steps == 0
    for prompt, result in zip(PROMPTS, results, strict=False):
        assert (result.finish_reason, result.tokens) == ("length", 1)
        assert result.text == pipeline.decode(greedy_ids(pipeline, prompt, 1))


def test_empty_prompt_starts_from_bos(pipeline: CausalLMTextPipeline) -> None:
    (result,) = engine_for(pipeline).run([TextItem(prompt="", max_new_tokens=5)])
    bos = pipeline.tokenizer.bos_token_id
    ids = torch.tensor([[pipeline.tokenizer.eos_token_id if bos is None else bos]])
    with torch.inference_mode():
        logits = pipeline.model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    first = int(logits[0, -1].argmax())
    # This model's first greedy token from BOS is its EOS: the item stops with no text.
    assert first in pipeline.eos_ids
    assert (result.text, result.finish_reason, result.tokens) == ("", "stop", 1)


def test_a_prompt_past_the_context_fails_beside_a_short_prompt(pipeline: CausalLMTextPipeline,
                                                               loop: Loop) -> None:
    # Refused, never cut to its tail; the short one beside it goes on.
    long_prompt = " ".join(["word"] * 1200)
    assert len(pipeline.tokenizer(long_prompt)["input_ids"]) > 1024
    items = [
        TextItem(prompt=long_prompt, max_new_tokens=20),
        TextItem(prompt=PROMPTS[1], max_new_tokens=20, temperature=1.0, seed=7),
    ]
    engine = engine_for(pipeline)

    async def both():
        return await asyncio.gather(*(engine.submit(i) for i in items), return_exceptions=True)

    refused, short = loop.run(both())
    assert isinstance(refused, ContextLengthExceeded) and refused.context == 1024
    assert refused.code == "context_length_exceeded"
    assert short == alone(pipeline, items[1:])[0]
    assert (short.finish_reason, short.tokens) == ("length", 20)


def test_early_stop_on_eos_retires_the_row(pipeline: CausalLMTextPipeline,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    expected = greedy_ids(pipeline, PROMPTS[0], 4)
    monkeypatch.setattr(pipeline, "eos_ids", frozenset({expected[3]}))
    (result,) = engine_for(pipeline).run([TextItem(prompt=PROMPTS[0], max_new_tokens=300)])
    assert result.finish_reason == "stop"
    assert result.tokens == expected.index(expected[3]) + 1
    assert not engine_for(pipeline).scheduling.running


def test_a_waiting_item_that_is_withdrawn_leaves_at_once(model_dir: Path, loop: Loop):
    pipe = _pipeline(model_dir, name="tiny-gpt2-one-slot", max_batch=1)
    engine = engine_for(pipe)
    withdrawn = threading.Event()

    async def scenario():
        long = asyncio.ensure_future(engine.submit(TextItem(prompt="a", max_new_tokens=500)))
        while not engine_for(pipe).scheduling.running:
            await asyncio.sleep(0.001)
        waiting = asyncio.ensure_future(engine.submit(TextItem(prompt="b", max_new_tokens=5),
                                                      Ticket(withdrawn=withdrawn.is_set)))
        await asyncio.sleep(0.01)
        withdrawn.set()
        engine.poke()  # as the worker does when it stops a held sub-request
        with pytest.raises(PipelineStopped):
            await asyncio.wait_for(waiting, 1)
        assert not long.done()  # it left while the slot was still taken
        return await long

    assert loop.run(scenario()).tokens == 500


def test_one_poison_row_fails_alone_and_the_rows_beside_it_succeed(
    pipeline: CausalLMTextPipeline, loop: Loop
):
    # A top_k no float can hold (the API refuses it; a crafted sub-request could carry it).
    poison = TextItem(prompt=PROMPTS[0], max_new_tokens=6, temperature=1.0, top_k=10**400)
    items = [TextItem(prompt=p, max_new_tokens=6 + i, temperature=0.8 * (i % 2), seed=i)
             for i, p in enumerate(PROMPTS[1:5])]
    reference = alone(pipeline, items)
    engine = engine_for(pipeline)

    async def together():
        engine.scheduling.expected = 5  # announced together: one prefill holds them all
        futures = []
        for item in [*items[:2], poison, *items[2:]]:
            engine.scheduling.expected -= 1
            futures.append(engine.submit(item))
        return await asyncio.gather(*futures, return_exceptions=True)

    results = loop.run(together())
    assert isinstance(results[2], OverflowError)
    assert [*results[:2], *results[3:]] == reference
    decoder = engine_for(pipeline).scheduling
    assert not decoder.running and not decoder.waiting


def test_an_arrival_starts_soon_while_a_slot_is_free_for_it(pipeline: CausalLMTextPipeline):
    decoder = engine_for(pipeline).scheduling
    assert not decoder.running and not decoder.waiting and decoder.expected == 0
    other = asyncio.new_event_loop()
    try:
        decoder.expected = decoder.slots  # itself and the arrivals ahead of it
        assert decoder.starts_soon()
        decoder.expected += 1
        assert not decoder.starts_soon()
        decoder.expected = 1
        # An isolated item runs alone: nothing arriving beside it starts soon.
        decoder.waiting.append(Waiting(TextItem(prompt="a", max_new_tokens=2), None,
                                                    other.create_future(), other,
                                                    isolate=True))
        assert not decoder.starts_soon()
    finally:
        decoder.expected = 0
        decoder.waiting.clear()
        other.close()


def test_an_item_charged_with_its_lease_is_not_announced_again(pipeline: CausalLMTextPipeline,
                                                               loop: Loop):
    items = [TextItem(prompt=p, max_new_tokens=5) for p in PROMPTS[:3]]
    reference = alone(pipeline, items)
    started = []

    async def on_start(tags):
        started.extend(tags)

    engine = Engine(pipeline, on_start=on_start)

    async def together():
        return await asyncio.gather(*(engine.submit(item, Ticket(tag=f"t{i}", charged=i == 1))
                                      for i, item in enumerate(items)))

    assert loop.run(together()) == reference
    assert sorted(started) == ["t0", "t2"]


def test_an_isolated_row_decodes_with_nothing_beside_it(pipeline: CausalLMTextPipeline,
                                                        loop: Loop):
    """A sub-request that was on the device when a worker was lost runs alone: rows that
    arrive while it decodes wait, and what starts is announced (charged) before it starts."""
    isolated = TextItem(prompt=PROMPTS[0], max_new_tokens=30)
    others = [TextItem(prompt=p, max_new_tokens=4) for p in PROMPTS[1:4]]
    reference = alone(pipeline, [isolated, *others])
    shared_iterations, started = [], []

    async def on_start(tags):
        started.append(list(tags))

    engine = Engine(pipeline, on_start=on_start)
    decoder = engine.scheduling
    original = decoder._iterate

    def iterate(admit):
        rows = [r.waiting.tag for r in decoder.running] + [w.tag for w in admit]
        if "iso" in rows and len(rows) > 1:
            shared_iterations.append(rows)
        return original(admit)

    decoder._iterate = iterate

    async def scenario():
        first = asyncio.ensure_future(engine.submit(isolated, Ticket(tag="iso", isolate=True)))
        while not decoder.running:
            await asyncio.sleep(0.001)
        rest = await asyncio.gather(*(engine.submit(o, Ticket(tag=f"o{i}"))
                                      for i, o in enumerate(others)))
        return [await first, *rest]

    try:
        assert loop.run(scenario()) == reference
    finally:
        del decoder._iterate
    assert shared_iterations == []
    later = sorted(t for tags in started[1:] for t in tags)
    assert started[0] == ["iso"] and later == ["o0", "o1", "o2"]


@pytest.mark.parametrize(("join_sooner_s", "rows"), [
    (0.0, [1, 1, 2]),  # steps long enough: the iteration ends at the arrival's step
    (3600.0, [1, 1, 1, 1, 2]),  # steps too short to be worth an extra iteration
])
def test_an_arrival_for_a_free_slot_joins_at_the_next_step_when_steps_are_long(
        pipeline: CausalLMTextPipeline, loop: Loop, monkeypatch: pytest.MonkeyPatch,
        join_sooner_s: float, rows: list[int]):
    monkeypatch.setattr(decoder_module, "JOIN_SOONER_S", join_sooner_s)
    long = TextItem(prompt=PROMPTS[1], max_new_tokens=40)
    late = TextItem(prompt=PROMPTS[4], max_new_tokens=10)
    reference = alone(pipeline, [long, late])
    decoder = engine_for(pipeline).scheduling
    engine = engine_for(pipeline)
    rows_per_step: list[int] = []
    step = decoder._step
    late_results: list[asyncio.Future] = []

    def stepping(k: int) -> None:  # on the device thread
        step(k)
        rows_per_step.append(len(decoder.running))
        if len(rows_per_step) == 2:  # mid-iteration: the late item arrives now
            loop.loop.call_soon_threadsafe(
                lambda: late_results.append(asyncio.ensure_future(engine.submit(late))))
            deadline = time.monotonic() + 10
            while not decoder.waiting and time.monotonic() < deadline:
                time.sleep(0.001)
            assert decoder.waiting

    decoder._step = stepping
    try:
        async def scenario():
            first = await engine.submit(long)
            return [first, await late_results[0]]

        assert loop.run(scenario()) == reference
    finally:
        del decoder._step
    assert rows_per_step[:len(rows)] == rows


def test_a_wider_prompt_joining_keeps_the_running_rows_whole(
    pipeline: CausalLMTextPipeline, loop: Loop, monkeypatch: pytest.MonkeyPatch
):
    # The running row's few columns end before the joining prompt's width: the shared column
    # moves on past them, leaving a gap. Once the wide row has left, the step's window must
    # still reach back to the running row's first columns (its prompt).
    running = TextItem(prompt=PROMPTS[6], max_new_tokens=40, temperature=0.9, seed=3)
    wide = TextItem(prompt=PROMPTS[1], max_new_tokens=2)
    reference = alone(pipeline, [running, wide])
    cut_off = []  # decode steps whose keys left out a running row's own tokens
    update = text_cache.PagedCache.update

    def checking(self, key_states, value_states, layer_idx, *args, **kwargs):
        keys, values = update(self, key_states, value_states, layer_idx, *args, **kwargs)
        if layer_idx == 0 and self.decoding:  # a decode step
            held = max(r.columns for r in engine.scheduling.running) + 1
            if keys.shape[2] < held:
                cut_off.append(keys.shape[2])
        return keys, values

    monkeypatch.setattr(text_cache.PagedCache, "update", checking)
    engine = engine_for(pipeline)

    async def scenario():
        joined = loop.loop.create_future()

        def on_text(update) -> None:  # on the device thread, while the cache is nearly empty
            if not joined.done():
                loop.loop.call_soon_threadsafe(
                    lambda: joined.done() or joined.set_result(
                        asyncio.ensure_future(engine.submit(wide))))

        first = await engine.submit(running, Ticket(on_text=on_text))
        return [first, await (await joined)]

    assert len(pipeline.tokenizer(PROMPTS[6])["input_ids"]) + STEPS_PER_READ < len(
        pipeline.tokenizer(PROMPTS[1])["input_ids"])  # the scenario above holds
    assert loop.run(scenario()) == reference
    assert cut_off == []
