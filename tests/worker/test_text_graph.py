"""The causal-LM text graph on the engine: device syncs, buffer pool leases, branches, limits."""

import asyncio
import math
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from services.worker import metrics
from services.worker.engine import sync
from services.worker.engine.batch import Batch
from services.worker.pipelines.stopped import PipelineStopped
from services.worker.pipelines.text import CausalLMTextPipeline
from services.worker.pipelines.text_operators import POLL_EVERY
from shared.messages import TextItem
from shared.registry import ModelKind, ModelSpec
from tests.worker.text_reference import alone, greedy_ids

MODEL = "tiny-gpt2-graph"  # a name of its own, so no other test moves its counters
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


@pytest.fixture(scope="module")
def pipeline(model_dir: Path) -> CausalLMTextPipeline:
    # Defaults: max_batch 8, 32 new tokens, 2 sets per bucket.
    spec = ModelSpec(name=MODEL, kind=ModelKind.CAUSAL_LM, path=model_dir / "tiny-gpt2")
    pipe = CausalLMTextPipeline(spec, torch.device("cpu"))
    pipe.setup()
    return pipe


def phase_count(phase: str) -> float:
    for family in metrics.PHASE_SECONDS.collect():
        for sample in family.samples:
            if sample.name.endswith("_count") and sample.labels == {
                "model": MODEL,
                "phase": phase,
            }:
                return sample.value
    return 0.0


def leases(outcome: str) -> float:
    return metrics.BUFFER_LEASES.labels(MODEL, outcome)._value.get()


def all_free(pipe: CausalLMTextPipeline) -> bool:
    return pipe.pool.free_sets == pipe.pool.pooled_sets and pipe.pool.adhoc_live == 0


@contextmanager
def leased_sets(pipe: CausalLMTextPipeline, monkeypatch: pytest.MonkeyPatch):
    """Record every buffer set the pipeline leases."""
    seen = []
    lease = pipe.pool.lease

    @contextmanager
    def recording(key):
        with lease(key) as buffers:
            seen.append(buffers)
            yield buffers

    monkeypatch.setattr(pipe.pool, "lease", recording)
    yield seen
    monkeypatch.undo()


def test_pool_buckets(pipeline: CausalLMTextPipeline) -> None:
    # A 64-token prompt plus the default 32 new tokens fits 128; capacities up to max_batch.
    assert pipeline.pool.buckets() == [(1, 128), (2, 128), (4, 128), (8, 128)]
    assert pipeline.pool.pooled_sets == 8
    # Batches that fit take the pooled length; others a power of two of at least 32, capped at
    # the position limit unless a mixed batch needs more.
    assert pipeline.cache_len(1, 20) == 128
    assert pipeline.cache_len(4, 128) == 128
    assert pipeline.cache_len(4, 129) == 256
    assert pipeline.cache_len(16, 20) == 32
    assert pipeline.cache_len(2, 1000) == 1024
    assert pipeline.cache_len(2, 1040) == 1040


@pytest.mark.parametrize("n", [1, 5])
def test_one_output_sync_per_batch(pipeline: CausalLMTextPipeline, n: int) -> None:
    budgets = [20, 7, 13, 20, 3][:n]
    items = [
        TextItem(prompt=p, max_new_tokens=b, temperature=0.9 * (i % 2), seed=i)
        for i, (p, b) in enumerate(zip(PROMPTS, budgets, strict=False))
    ]
    output, total = sync.count(MODEL, "output"), sync.count(MODEL)
    results = pipeline.run(items)
    assert [r.tokens for r in results] == budgets  # the tiny model never emits its EOS here
    assert sync.count(MODEL, "output") - output == 1
    steps = max(budgets) - 1  # decode steps after the prefill's token
    assert sync.count(MODEL) - total <= 1 + math.ceil(steps / POLL_EVERY)


def test_early_exit_when_every_row_hit_eos(
    pipeline: CausalLMTextPipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = greedy_ids(pipeline, PROMPTS[0], 4)
    monkeypatch.setattr(pipeline, "eos_ids", frozenset({expected[3]}))
    polls, decode = sync.count(MODEL, "poll"), phase_count("decode")
    (result,) = pipeline.run([TextItem(prompt=PROMPTS[0], max_new_tokens=30)])
    assert result.finish_reason == "stop"
    assert result.tokens == expected.index(expected[3]) + 1
    # The first poll (after step 8) sees the row done: no more steps, no more polls.
    assert sync.count(MODEL, "poll") - polls == 1
    assert phase_count("decode") - decode == 1


def test_batch_within_pool_takes_no_adhoc_lease(pipeline: CausalLMTextPipeline) -> None:
    adhoc, pooled = leases("adhoc"), leases("pooled")
    pipeline.run([TextItem(prompt=p, max_new_tokens=6) for p in PROMPTS[:5]])
    pipeline.run([TextItem(prompt=PROMPTS[1], max_new_tokens=40)])
    assert leases("adhoc") == adhoc
    assert leases("pooled") - pooled == 2
    assert all_free(pipeline)


def test_pooled_kv_cache_is_reused(
    pipeline: CausalLMTextPipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    item = TextItem(prompt=PROMPTS[2], max_new_tokens=9)
    with leased_sets(pipeline, monkeypatch) as seen:
        first = pipeline.run([item])
        keys = seen[0]["cache"].layers[0].keys
        pointer = keys.data_ptr()
        second = pipeline.run([item])
    assert first == second
    assert len(seen) == 2 and seen[0] is seen[1] and not seen[0].adhoc
    cache = seen[1]["cache"]
    assert cache.layers[0].keys is keys and keys.data_ptr() == pointer


def test_sets_are_returned_after_stop_and_failure(
    pipeline: CausalLMTextPipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = [TextItem(prompt=p, max_new_tokens=10) for p in PROMPTS[:3]]
    pipeline.run(items)
    assert all_free(pipeline)

    calls = 0

    def should_stop() -> bool:
        nonlocal calls
        calls += 1
        return calls == 4

    with pytest.raises(PipelineStopped):
        pipeline.run(items, should_stop=should_stop)
    assert all_free(pipeline)

    def boom(*args, **kwargs):
        raise RuntimeError("injected")

    with monkeypatch.context() as m:
        m.setattr(pipeline.graph["decode"], "run", boom)
        with pytest.raises(RuntimeError, match="injected"):
            pipeline.run(items)
    assert all_free(pipeline)
    with monkeypatch.context() as m:
        m.setattr(pipeline.graph["detokenize"], "run", boom)
        with pytest.raises(RuntimeError, match="injected"):
            pipeline.run(items)
    assert all_free(pipeline)
    # The pool still serves, with the same results.
    assert pipeline.run(items) == alone(pipeline, items)


def test_stopped_item_leaves_the_rest_running(pipeline: CausalLMTextPipeline) -> None:
    items = [TextItem(prompt=p, max_new_tokens=12) for p in PROMPTS[:3]]
    calls = 0

    def stop_second() -> bool:
        nonlocal calls
        calls += 1
        return calls >= 3  # asked before prefill, step 1, then stops before step 2

    stopped: list[int] = []
    batch = Batch(items, [None, stop_second, None], on_stop=stopped.append)
    results = asyncio.run(pipeline.run_async(batch))
    assert stopped == [1]
    assert results[1].finish_reason == "canceled" and results[1].tokens == 2
    assert [results[0], results[2]] == alone(pipeline, [items[0], items[2]])
    assert all_free(pipeline)


def test_batch_of_8_greedy_matches_alone(pipeline: CausalLMTextPipeline) -> None:
    items = [TextItem(prompt=p, max_new_tokens=4 + 2 * i) for i, p in enumerate(PROMPTS)]
    batched = pipeline.run(items)
    assert batched == alone(pipeline, items)
    assert [r.tokens for r in batched] == [4 + 2 * i for i in range(8)]


def test_single_token_skips_the_decode_loop(pipeline: CausalLMTextPipeline) -> None:
    decode, prefill = phase_count("decode"), phase_count("prefill")
    items = [TextItem(prompt=p, max_new_tokens=1) for p in PROMPTS[:3]]
    results = pipeline.run(items)
    assert phase_count("decode") == decode
    assert phase_count("prefill") == prefill + 1
    for prompt, result in zip(PROMPTS, results, strict=False):
        assert (result.finish_reason, result.tokens) == ("length", 1)
        assert result.text == pipeline.decode(greedy_ids(pipeline, prompt, 1))
    # One item that needs a second token takes the loop.
    pipeline.run([*items[:2], TextItem(prompt=PROMPTS[2], max_new_tokens=2)])
    assert phase_count("decode") == decode + 1


def test_empty_prompt_starts_from_bos(pipeline: CausalLMTextPipeline) -> None:
    (result,) = pipeline.run([TextItem(prompt="", max_new_tokens=5)])
    bos = pipeline.tokenizer.bos_token_id
    ids = torch.tensor([[pipeline.tokenizer.eos_token_id if bos is None else bos]])
    with torch.inference_mode():
        logits = pipeline.model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    first = int(logits[0, -1].argmax())
    # This model's first greedy token from BOS is its EOS: the item stops with no text.
    assert first in pipeline.eos_ids
    assert (result.text, result.finish_reason, result.tokens) == ("", "stop", 1)


def test_position_limit_in_a_mixed_batch(pipeline: CausalLMTextPipeline) -> None:
    # A prompt near the position limit leaves it a small budget; beside a short prompt with a
    # larger one, the batch needs more cache slots than positions exist.
    long_prompt = " ".join(["word"] * 1200)
    assert len(pipeline.tokenizer(long_prompt)["input_ids"]) > 1024
    items = [
        TextItem(prompt=long_prompt, max_new_tokens=20),
        TextItem(prompt=PROMPTS[1], max_new_tokens=20, temperature=1.0, seed=7),
    ]
    batched = pipeline.run(items)
    assert batched == alone(pipeline, items)
    assert [(r.finish_reason, r.tokens) for r in batched] == [("length", 1), ("length", 20)]
    assert all_free(pipeline)
