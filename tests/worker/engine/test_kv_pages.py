"""The paged KV cache under a memory budget: short rows share a pool one long row would fill,
rows wait for pages, running rows preempt the youngest when they need one, and every page goes
back to the pool whatever ends a row."""

import asyncio
import threading
from pathlib import Path

import pytest
import torch

from services.worker import metrics
from services.worker.engine.batch import Batch
from services.worker.engine.engine import Engine
from services.worker.engine.growth import GrowthEstimate
from services.worker.engine.kv_budget import CPU_DEFAULT_BYTES, Budget, budget_bytes
from services.worker.engine.scheduling import PLAIN, Ticket
from services.worker.engine.stopped import PipelineStopped
from services.worker.engine.text_cache import PAGE_TOKENS
from services.worker.pipelines.text import CausalLMTextPipeline
from shared.messages import TextItem
from shared.registry import ModelKind, ModelSpec
from tests.worker.engine.test_decoder import Loop
from tests.worker.engines import engine_for
from tests.worker.text_reference import alone

# tiny-gpt2: 2 layers, 64 wide, float32: keys and values of one 16-token page.
PAGE_BYTES = 2 * 2 * PAGE_TOKENS * 64 * 4
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog"]


def _pipeline(model_dir: Path, name: str, **spec) -> CausalLMTextPipeline:
    pipe = CausalLMTextPipeline(
        ModelSpec(name=name, kind=ModelKind.CAUSAL_LM, path=model_dir / "tiny-gpt2", **spec),
        torch.device("cpu"))
    pipe.load()
    return pipe


@pytest.fixture
def loop():
    lp = Loop()
    yield lp
    lp.close()


def _no_reserve() -> GrowthEstimate:
    """Admission on a row's prompt and next steps alone (vLLM's), never learning otherwise:
    rows then grow into each other, so the tests of preemption get it for sure."""
    return GrowthEstimate(ratio=0.0, floor=0.0, step=0.0)


def _used(pipe: CausalLMTextPipeline) -> float:
    return metrics.KV_PAGES_USED.labels(pipe.spec.name)._value.get()


def _preemptions(pipe: CausalLMTextPipeline) -> float:
    return metrics.KV_PREEMPTIONS.labels(pipe.spec.name)._value.get()


def test_the_budget_comes_from_the_model_then_the_worker_then_the_device() -> None:
    cpu = torch.device("cpu")
    assert budget_bytes(Budget(5, 7), cpu) == 5
    assert budget_bytes(Budget(None, 7), cpu) == 7
    assert budget_bytes(Budget(), cpu) == CPU_DEFAULT_BYTES


def test_the_pool_holds_one_full_row_at_least_and_the_rows_contexts_at_most(model_dir: Path):
    small = _pipeline(model_dir, "tiny-gpt2-kv-small", kv_cache_bytes=1)
    assert small.kv_cache(8).pool.total == 1024 // PAGE_TOKENS
    large = _pipeline(model_dir, "tiny-gpt2-kv-large", kv_cache_bytes=1 << 40)
    assert large.kv_cache(8).pool.total == 8 * 1024 // PAGE_TOKENS
    budgeted = _pipeline(model_dir, "tiny-gpt2-kv-budget", kv_cache_bytes=100 * PAGE_BYTES)
    cache = budgeted.kv_cache(8)
    assert cache.pool.total == 100
    assert metrics.KV_PAGES_TOTAL.labels("tiny-gpt2-kv-budget")._value.get() == 100
    assert sum(k.numel() * k.element_size() for k in cache.keys + cache.values) == \
        101 * PAGE_BYTES  # and page 0


def test_32_short_rows_run_together_in_one_full_context_rows_memory(model_dir: Path):
    one_row = 1024 // PAGE_TOKENS * PAGE_BYTES
    pipe = _pipeline(model_dir, "tiny-gpt2-kv-32", max_batch=32, kv_cache_bytes=one_row)
    items = [TextItem(prompt=" ".join(WORDS[i % 8:i % 8 + 2]), max_new_tokens=8,
                      temperature=0.8 * (i % 2), seed=i) for i in range(32)]
    reference = alone(pipe, items)
    decoder = engine_for(pipe).scheduling
    assert decoder.cache.pool.total == 1024 // PAGE_TOKENS
    widest = 0
    step = decoder._step

    def counting(k: int) -> None:
        nonlocal widest
        widest = max(widest, len(decoder.running))
        step(k)

    decoder._step = counting
    try:
        assert engine_for(pipe).run(items) == reference
    finally:
        del decoder._step
    assert widest == 32
    assert decoder.cache.used == 0 and _used(pipe) == 0


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_row_preempted_for_pages_is_recomputed_to_the_same_tokens(
        model_dir: Path, loop: Loop, temperature: float):
    # Two rows of up to 64 tokens (4 pages) in a pool of 4 pages: both start, and when the
    # older one needs a page, the younger gives its pages back and waits, then runs again from
    # its prompt and the tokens it made.
    pipe = _pipeline(model_dir, f"tiny-gpt2-kv-preempt-{temperature}", max_context=64,
                     max_batch=2, kv_cache_bytes=4 * PAGE_BYTES)
    items = [TextItem(prompt=f"the quick brown fox number {i}", max_new_tokens=50,
                      temperature=temperature, seed=11 + i) for i in range(2)]
    reference = alone(pipe, items)
    assert [r.tokens for r in reference] == [50, 50]  # no EOS: the scenario holds
    before = _preemptions(pipe)
    engine = engine_for(pipe)
    engine.scheduling.growth = _no_reserve()

    async def together():
        return await asyncio.gather(*(engine.submit(item) for item in items))

    assert loop.run(together()) == reference
    assert _preemptions(pipe) > before
    assert engine.scheduling.cache.used == 0 and _used(pipe) == 0


def test_an_item_waits_for_pages_while_a_row_slot_is_free(model_dir: Path, loop: Loop):
    pipe = _pipeline(model_dir, "tiny-gpt2-kv-wait", max_context=64, max_batch=4,
                     kv_cache_bytes=4 * PAGE_BYTES)
    long = TextItem(prompt="the quick brown fox jumps over the lazy dog " * 2,
                    max_new_tokens=12)
    short = TextItem(prompt="the lazy dog", max_new_tokens=5)
    reference = alone(pipe, [long, short])
    assert 49 <= len(pipe.tokenizer(long.prompt)["input_ids"]) + 4 <= 64
    decoder = engine_for(pipe).scheduling
    seen = []  # (running rows, rows waiting for pages) at each iteration
    iterate = decoder._iterate

    def recording(admit):
        settles = iterate(admit)
        seen.append((len(decoder.running), decoder.short_of_pages,
                     metrics.KV_ROWS_WAITING.labels(pipe.spec.name)._value.get()))
        return settles

    decoder._iterate = recording
    engine = engine_for(pipe)

    async def scenario():
        first = asyncio.ensure_future(engine.submit(long))
        while not decoder.running:
            await asyncio.sleep(0.001)
        second = asyncio.ensure_future(engine.submit(short))
        return [await first, await second]

    try:
        assert loop.run(scenario()) == reference
    finally:
        del decoder._iterate
    # The long row's prompt and next steps take the 4 pages: the short item waited for one
    # with three row slots free, and ran once the long row was done.
    assert any(rows == 1 and waits == gauge == 1 for rows, waits, gauge in seen)
    assert not decoder.short_of_pages and decoder.cache.used == 0


def test_every_page_goes_back_whatever_ends_a_row(model_dir: Path, loop: Loop,
                                                 monkeypatch: pytest.MonkeyPatch):
    pipe = _pipeline(model_dir, "tiny-gpt2-kv-return", max_context=64, max_batch=4,
                     kv_cache_bytes=4 * PAGE_BYTES)
    engine = engine_for(pipe)
    decoder = engine.scheduling
    decoder.growth = _no_reserve()
    items = [TextItem(prompt=f"the quick brown fox {i}", max_new_tokens=40, seed=i,
                      temperature=0.5 * (i % 2)) for i in range(4)]

    def returned() -> bool:
        return decoder.cache.used == 0 and _used(pipe) == 0 and not decoder.running

    # Success, through preemptions.
    before = _preemptions(pipe)
    assert [r.tokens for r in engine.run(items)] == [40] * 4
    assert _preemptions(pipe) > before and returned()

    # Stopped mid-way.
    calls = 0

    def stop_later() -> bool:
        nonlocal calls
        calls += 1
        return calls > 5

    results = asyncio.run(engine.run_async(Batch(items[:2], [None, stop_later])))
    assert results[1].finish_reason == "canceled" and returned()

    # Failed in the model.
    def boom(*args, **kwargs):
        raise RuntimeError("injected")

    with monkeypatch.context() as m:
        m.setattr(pipe, "forward", boom)
        with pytest.raises(RuntimeError, match="injected"):
            engine.run(items[:2])
    assert returned() and not decoder.waiting

    # Stopped while it waited for pages (the youngest row: preempted, or held back).
    before = _preemptions(pipe)

    async def stopped_while_waiting():
        tickets = [Ticket(should_stop=lambda: _preemptions(pipe) > before) if i == 3
                   else PLAIN for i in range(4)]
        return await asyncio.gather(*(engine.submit(item, t)
                                      for item, t in zip(items, tickets, strict=True)),
                                    return_exceptions=True)

    outcomes = loop.run(stopped_while_waiting(), timeout=60)
    assert [o.tokens for o in outcomes[:3]] == [40] * 3
    assert isinstance(outcomes[3], PipelineStopped)
    assert returned() and not decoder.waiting


def test_admission_keeps_pages_for_the_running_rows_growth(model_dir: Path, loop: Loop):
    # Rows that run to their budget in a pool of two of them: admitted on their prompts alone
    # they preempt each other as they grow; with pages kept for the growth the estimate
    # learns, fewer are preempted, and every row still gives its tokens alone.
    items = [TextItem(prompt=f"the quick brown fox number {i}", max_new_tokens=40,
                      temperature=0.9 * (i % 2), seed=i) for i in range(8)]
    preempted = {}
    for name, growth in (("none", _no_reserve()),
                         ("learned", GrowthEstimate())):
        pipe = _pipeline(model_dir, f"tiny-gpt2-kv-growth-{name}", max_context=64, max_batch=8,
                         kv_cache_bytes=8 * PAGE_BYTES)
        reference = alone(pipe, items)
        engine = engine_for(pipe)
        engine.scheduling.growth = growth
        before = _preemptions(pipe)

        async def together(engine=engine):
            return await asyncio.gather(*(engine.submit(item) for item in items))

        assert loop.run(together()) == reference
        preempted[name] = _preemptions(pipe) - before
        assert engine.scheduling.cache.used == 0
    assert preempted["learned"] < preempted["none"], preempted


def test_the_tokens_gauge_reads_against_the_pages_used(model_dir: Path, loop: Loop):
    # fibermill_kv_cache_tokens over 16 x fibermill_kv_cache_pages_used is how full the pages
    # are: after each iteration, each running row's pages hold its tokens with its last page
    # partly empty, and nothing is held once every row has ended.
    pipe = _pipeline(model_dir, "tiny-gpt2-kv-tokens", max_context=128, max_batch=4)
    engine = engine_for(pipe)
    decoder = engine.scheduling
    tokens = metrics.KV_TOKENS.labels(pipe.spec.name)
    seen: list[tuple[float, float, int]] = []
    iterate = decoder._iterate

    def watched(admit):
        settles = iterate(admit)
        seen.append((tokens._value.get(), _used(pipe), len(decoder.running)))
        return settles

    decoder._iterate = watched
    items = [TextItem(prompt=" ".join(WORDS[: 1 + i]), max_new_tokens=10 + 7 * i)
             for i in range(4)]

    async def together():
        return await asyncio.gather(*(engine.submit(item) for item in items))

    loop.run(together())
    running = [(t, used, rows) for t, used, rows in seen if rows]
    assert running
    for held, used, rows in running:
        assert PAGE_TOKENS * (used - rows) < held <= PAGE_TOKENS * used
    assert tokens._value.get() == 0 and _used(pipe) == 0


def test_the_decoders_cache_is_made_on_the_device_thread(model_dir: Path):
    # The thread that runs the model is the only one that runs torch work for it: on the CPU
    # each thread running torch ops gets an OpenMP team of its own, which cost the small models
    # 2.6x a burst when the pool was made on the thread that built the engine.
    pipe = _pipeline(model_dir, "tiny-gpt2-kv-thread", max_batch=4)
    made_on: list[int] = []
    kv_cache = pipe.kv_cache

    def watched(rows: int):
        made_on.append(threading.get_ident())
        return kv_cache(rows)

    pipe.kv_cache = watched  # type: ignore[method-assign]
    Engine(pipe)
    assert made_on == [pipe.device_executor.submit(threading.get_ident).result()]
    assert made_on[0] != threading.get_ident()
