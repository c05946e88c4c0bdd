"""Prefix caching in the continuous decoder: a prompt that begins with the full pages of
another's (running, or finished and still cached) computes only the rest, sharing those pages;
rows arriving together with one beginning compute it once; the tokens are those of each prompt
alone; cached pages give way to new rows, least recently used first."""

import asyncio
from pathlib import Path

import pytest
import torch

from services.worker import metrics
from services.worker.engine.scheduling import Ticket
from services.worker.engine.text_cache import PAGE_TOKENS
from services.worker.pipelines.text import CausalLMTextPipeline
from shared.messages import TextItem
from shared.registry import ModelKind, ModelSpec
from tests.worker.engine.test_decoder import Loop
from tests.worker.engines import engine_for
from tests.worker.text_reference import greedy_ids

SYSTEM = ("You are a careful assistant. Answer in one short sentence, and say so when you do "
          "not know the answer to the question that follows. ")
TAILS = ["What is the capital of France?", "Name a prime number.", "Why is the sky blue?",
         "Count to three.", "Say hello."]
NEW_TOKENS = 6
PAGE_BYTES = 2 * 2 * PAGE_TOKENS * 64 * 4  # tiny-gpt2's keys and values of one page


def _pipeline(model_dir: Path, name: str, **spec) -> CausalLMTextPipeline:
    pipe = CausalLMTextPipeline(
        ModelSpec(name=name, kind=ModelKind.CAUSAL_LM, path=model_dir / "tiny-gpt2", **spec),
        torch.device("cpu"))
    pipe.load()
    pipe.eos_ids = frozenset()  # every row runs its budget, as the reference does
    return pipe


@pytest.fixture
def loop():
    lp = Loop()
    yield lp
    lp.close()


def _hits(pipe: CausalLMTextPipeline) -> float:
    return metrics.KV_PREFIX_HIT_TOKENS.labels(pipe.spec.name)._value.get()


def _lookups(pipe: CausalLMTextPipeline) -> float:
    return metrics.KV_PREFIX_LOOKUP_TOKENS.labels(pipe.spec.name)._value.get()


def _computed(pipe: CausalLMTextPipeline, monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """Each prefill's real tokens per row, as the model computes them."""
    seen: list[list[int]] = []
    forward = pipe.forward

    def watched(ids, mask, positions, cache):
        if ids.shape[1] > 1:  # a decode step computes one token a row
            seen.append([int(n) for n in (ids != pipe.pad_id).sum(1)])
        return forward(ids, mask, positions, cache)

    monkeypatch.setattr(pipe, "forward", watched)
    return seen


def _expected(pipe: CausalLMTextPipeline, prompts: list[str]) -> list[str]:
    return [pipe.decode(greedy_ids(pipe, p, NEW_TOKENS)) for p in prompts]


def _shared_tokens(pipe: CausalLMTextPipeline, a: str, b: str) -> int:
    """The tokens of the full pages two prompts begin with alike (and not the last one's
    token of the shorter)."""
    x, y = pipe.tokenizer(a)["input_ids"], pipe.tokenizer(b)["input_ids"]
    same = next((i for i, (s, t) in enumerate(zip(x, y, strict=False)) if s != t),
                min(len(x), len(y)))
    same = min(same, len(y) - 1)
    return same // PAGE_TOKENS * PAGE_TOKENS


def test_a_prompt_beginning_like_a_finished_ones_computes_only_the_rest(
        model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pipe = _pipeline(model_dir, "tiny-gpt2-prefix-later")
    prompts = [SYSTEM + t for t in TAILS[:2]]
    expected = _expected(pipe, prompts)
    shared = _shared_tokens(pipe, *prompts)
    assert shared >= 2 * PAGE_TOKENS
    engine = engine_for(pipe)
    computed = _computed(pipe, monkeypatch)
    first = engine.run([TextItem(prompt=prompts[0], max_new_tokens=NEW_TOKENS)])
    hits, lookups = _hits(pipe), _lookups(pipe)
    second = engine.run([TextItem(prompt=prompts[1], max_new_tokens=NEW_TOKENS)])
    assert [r.text for r in first + second] == expected
    length = len(pipe.tokenizer(prompts[1])["input_ids"])
    assert computed[1] == [length - shared]
    assert _hits(pipe) - hits == shared
    assert _lookups(pipe) - lookups == (length - 1) // PAGE_TOKENS * PAGE_TOKENS
    decoder = engine.scheduling
    assert decoder.cache.used == 0 and decoder.cache.pool.cached >= shared // PAGE_TOKENS


def test_rows_arriving_together_compute_their_common_beginning_once(
        model_dir: Path, loop: Loop, monkeypatch: pytest.MonkeyPatch) -> None:
    # A request's n choices, or a batch's lines: one prefill computes the beginning with the
    # first row, a second in the same iteration the rest of the others.
    pipe = _pipeline(model_dir, "tiny-gpt2-prefix-together", max_batch=8)
    prompts = [SYSTEM + t for t in TAILS] + [SYSTEM + TAILS[0]] * 2
    expected = _expected(pipe, prompts)
    engine = engine_for(pipe)
    computed = _computed(pipe, monkeypatch)
    hits = _hits(pipe)

    async def together():
        return await asyncio.gather(*(engine.submit(
            TextItem(prompt=p, max_new_tokens=NEW_TOKENS, temperature=0.7 * (i % 2), seed=i))
            for i, p in enumerate(prompts)))

    results = loop.run(together())
    greedy = [r.text for i, r in enumerate(results) if i % 2 == 0]
    assert greedy == [e for i, e in enumerate(expected) if i % 2 == 0]
    lengths = [len(pipe.tokenizer(p)["input_ids"]) for p in prompts]
    shared = [_shared_tokens(pipe, prompts[0], p) for p in prompts[1:]]
    assert computed[:2] == [[lengths[0]], [n - s for n, s in zip(lengths[1:], shared,
                                                                 strict=True)]]
    assert _hits(pipe) - hits == sum(shared)
    assert engine.scheduling.cache.used == 0


def test_sampled_rows_draw_the_same_tokens_with_a_cached_beginning(model_dir: Path) -> None:
    pipe = _pipeline(model_dir, "tiny-gpt2-prefix-sampled")
    fresh = _pipeline(model_dir, "tiny-gpt2-prefix-sampled-fresh")
    items = [TextItem(prompt=SYSTEM + t, max_new_tokens=NEW_TOKENS, temperature=0.9, seed=7)
             for t in TAILS[:3]]
    reference = [engine_for(fresh).run([item])[0] for item in items]
    engine = engine_for(pipe)
    engine.run(items[:1])  # caches the beginning
    hits = _hits(pipe)
    assert engine.run(items) == reference
    assert _hits(pipe) > hits


def test_cached_pages_give_way_to_new_rows(model_dir: Path) -> None:
    # A pool of 8 pages: the first prompts' pages stay cached when they end, and a row that
    # needs them all takes them (least recently used first) instead of waiting.
    pipe = _pipeline(model_dir, "tiny-gpt2-prefix-evict", max_context=128, max_batch=2,
                     kv_cache_bytes=8 * PAGE_BYTES)
    engine = engine_for(pipe)
    decoder = engine.scheduling
    assert decoder.cache.pool.total == 8
    engine.run([TextItem(prompt=SYSTEM + TAILS[0], max_new_tokens=NEW_TOKENS)])
    cached = decoder.cache.pool.cached
    assert cached >= 2
    evictions = metrics.KV_PREFIX_EVICTIONS.labels(pipe.spec.name)._value.get()
    other = "Entirely different words begin this prompt so nothing is shared. " * 3
    prompt_len = len(pipe.tokenizer(other)["input_ids"])
    assert prompt_len + 20 > (8 - cached) * PAGE_TOKENS  # it needs cached pages
    result = engine.run([TextItem(prompt=other, max_new_tokens=20)])[0]
    assert result.text == pipe.decode(greedy_ids(pipe, other, 20))
    assert metrics.KV_PREFIX_EVICTIONS.labels(pipe.spec.name)._value.get() > evictions
    assert decoder.cache.used == 0


def test_a_failed_iteration_forgets_every_cached_page(model_dir: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    pipe = _pipeline(model_dir, "tiny-gpt2-prefix-failed")
    engine = engine_for(pipe)
    engine.run([TextItem(prompt=SYSTEM + TAILS[0], max_new_tokens=NEW_TOKENS)])
    assert engine.scheduling.cache.pool.cached

    def boom(*args, **kwargs):
        raise RuntimeError("injected")

    with monkeypatch.context() as m:
        m.setattr(pipe, "forward", boom)
        with pytest.raises(RuntimeError, match="injected"):
            engine.run([TextItem(prompt=SYSTEM + TAILS[1], max_new_tokens=NEW_TOKENS)])
    cache = engine.scheduling.cache
    assert cache.pool.cached == 0 and cache.used == 0
    # And it serves again, computing the beginning anew.
    hits = _hits(pipe)
    result = engine.run([TextItem(prompt=SYSTEM + TAILS[1], max_new_tokens=NEW_TOKENS)])[0]
    assert result.text == _expected(pipe, [SYSTEM + TAILS[1]])[0]
    assert _hits(pipe) == hits


def test_only_items_of_one_cache_scope_share_pages(model_dir: Path, loop: Loop) -> None:
    # Arriving together, as a request's choices do: the second item of key A shares what the
    # first computed; key B's and the unscoped one compute their own.
    pipe = _pipeline(model_dir, "tiny-gpt2-prefix-scope", max_batch=8)
    engine = engine_for(pipe)
    item = TextItem(prompt=SYSTEM + TAILS[0], max_new_tokens=NEW_TOKENS)
    length = len(pipe.tokenizer(item.prompt)["input_ids"])
    hits = _hits(pipe)

    async def together():
        return await asyncio.gather(*(engine.submit(item, Ticket(cache_scope=scope))
                                      for scope in ("key-a", "key-b", "", "key-a")))

    results = loop.run(together())
    assert all(r == results[0] for r in results)
    assert _hits(pipe) - hits == (length - 1) // PAGE_TOKENS * PAGE_TOKENS


def test_a_row_moving_into_a_freed_slot_takes_its_cached_pages_home(
        model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Distinct prompts of several full pages each: when the first row ends, the last moves
    # into its batch row, its cached prompt pages with it, and every step still reads the
    # pool in place (a gather each step costs the larger models a copy of every row's keys).
    pipe = _pipeline(model_dir, "tiny-gpt2-prefix-move", max_batch=4)
    prompts = [f"{i} " + SYSTEM + TAILS[i] for i in range(3)]
    items = [TextItem(prompt=p, max_new_tokens=n) for p, n in zip(prompts, (4, 24, 24),
                                                                    strict=True)]
    engine = engine_for(pipe)
    cache = engine.scheduling.cache
    in_place: list[bool] = []
    for_decode = cache.for_decode

    def watched(positions, at, pages):
        for_decode(positions, at, pages)
        in_place.append(cache.in_place)

    monkeypatch.setattr(cache, "for_decode", watched)
    results = engine.run(items)
    assert [r.text for r in results] == [pipe.decode(greedy_ids(pipe, p, n))
                                         for p, n in zip(prompts, (4, 24, 24), strict=True)]
    assert in_place and all(in_place)
    # The moved row's prompt pages are still found by their content.
    hits = _hits(pipe)
    engine.run([TextItem(prompt=prompts[2], max_new_tokens=2)])
    assert _hits(pipe) - hits >= 2 * PAGE_TOKENS
