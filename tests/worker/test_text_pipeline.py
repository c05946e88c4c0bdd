"""The causal-LM text pipeline on the tiny random GPT-2: batching, seeding, budgets and stops."""

import asyncio
from pathlib import Path

import pytest
import torch

from services.worker.engine.batch import Batch
from services.worker.engine.stopped import PipelineStopped
from services.worker.pipelines.factory import build_pipeline
from services.worker.pipelines.text import CausalLMTextPipeline
from shared.errors import ContextLengthExceeded
from shared.messages import TextItem
from shared.registry import ModelKind, ModelSpec
from tests.worker.engines import engine_for
from tests.worker.text_reference import alone, greedy_ids

# Different lengths, so a batch of them is left-padded.
PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog, and then",
    "Return a new list of the items",
]


@pytest.fixture(scope="session")
def pipeline(model_dir: Path) -> CausalLMTextPipeline:
    spec = ModelSpec(name="tiny-gpt2", kind=ModelKind.CAUSAL_LM, path=model_dir / "tiny-gpt2")
    pipe = CausalLMTextPipeline(spec, torch.device("cpu"))
    pipe.setup()
    return pipe


def test_prompts_need_padding(pipeline: CausalLMTextPipeline) -> None:
    lengths = {len(pipeline.tokenizer(p)["input_ids"]) for p in PROMPTS}
    assert len(lengths) == len(PROMPTS)


def test_greedy_matches_uncached_reference(pipeline: CausalLMTextPipeline) -> None:
    for prompt in PROMPTS:
        (result,) = engine_for(pipeline).run([TextItem(prompt=prompt, max_new_tokens=12)])
        expected = greedy_ids(pipeline, prompt, 12)
        assert pipeline.eos_ids.isdisjoint(expected)  # else the comparison below is not 12 long
        assert result.text == pipeline.decode(expected)
        assert (result.finish_reason, result.tokens) == ("length", 12)


def test_greedy_batched_matches_alone(pipeline: CausalLMTextPipeline) -> None:
    budgets = [16, 5, 11]
    items = [TextItem(prompt=p, max_new_tokens=n) for p, n in zip(PROMPTS, budgets, strict=True)]
    batched = engine_for(pipeline).run(items)
    assert batched == alone(pipeline, items)
    assert [r.tokens for r in batched] == budgets


def test_sampled_is_reproducible_and_batched_matches_alone(
    pipeline: CausalLMTextPipeline,
) -> None:
    items = [
        TextItem(prompt=PROMPTS[0], max_new_tokens=14, temperature=1.0, seed=1),
        TextItem(prompt=PROMPTS[1], max_new_tokens=9, temperature=0.7, top_k=20, seed=2),
        TextItem(prompt=PROMPTS[2], max_new_tokens=12, temperature=1.3, top_p=0.8, seed=3),
        TextItem(prompt=PROMPTS[0], max_new_tokens=6),  # greedy rides along
    ]
    batched = engine_for(pipeline).run(items)
    assert engine_for(pipeline).run(items) == batched
    assert batched == alone(pipeline, items)
    # The same item in a different batch position and company still gives the same tokens.
    assert engine_for(pipeline).run(items[::-1]) == batched[::-1]


def test_different_seeds_give_different_text(pipeline: CausalLMTextPipeline) -> None:
    items = [
        TextItem(prompt=PROMPTS[0], max_new_tokens=12, temperature=1.0, seed=s) for s in range(4)
    ]
    texts = [r.text for r in engine_for(pipeline).run(items)]
    assert len(set(texts)) == len(texts)


def test_top_k_one_is_greedy(pipeline: CausalLMTextPipeline) -> None:
    sampled = TextItem(prompt=PROMPTS[1], max_new_tokens=10, temperature=1.0, top_k=1, seed=5)
    greedy = TextItem(prompt=PROMPTS[1], max_new_tokens=10)
    assert engine_for(pipeline).run([sampled]) == engine_for(pipeline).run([greedy])


def test_max_new_tokens_gives_length(pipeline: CausalLMTextPipeline) -> None:
    items = [
        TextItem(prompt=PROMPTS[2], max_new_tokens=1),
        TextItem(prompt=PROMPTS[2], max_new_tokens=7, temperature=1.0, seed=9),
    ]
    results = engine_for(pipeline).run(items)
    assert [(r.finish_reason, r.tokens) for r in results] == [("length", 1), ("length", 7)]
    assert results[0].text == pipeline.decode(greedy_ids(pipeline, PROMPTS[2], 1))


def test_stop_string_cuts_text(pipeline: CausalLMTextPipeline) -> None:
    item = TextItem(prompt=PROMPTS[2], max_new_tokens=20)
    (full,) = engine_for(pipeline).run([item])
    stop = full.text[6:9]
    run = engine_for(pipeline).run
    (stopped,) = run([item.model_copy(update={"stop": ["never appears", stop]})])
    assert stopped.finish_reason == "stop"
    assert stopped.text == full.text[: full.text.index(stop)]
    # The count includes the token that completed the stop string, and no more.
    (upto,) = run([item.model_copy(update={"max_new_tokens": stopped.tokens})])
    (before,) = run([item.model_copy(update={"max_new_tokens": stopped.tokens - 1})])
    assert stop in upto.text
    assert stop not in before.text


def test_stop_items_batched_match_alone(pipeline: CausalLMTextPipeline) -> None:
    (full,) = engine_for(pipeline).run([TextItem(prompt=PROMPTS[1], max_new_tokens=20)])
    items = [
        TextItem(prompt=PROMPTS[0], max_new_tokens=15, temperature=1.0, seed=4, stop=["e"]),
        TextItem(prompt=PROMPTS[1], max_new_tokens=20, stop=[full.text[4:6]]),
        TextItem(prompt=PROMPTS[2], max_new_tokens=8),
    ]
    batched = engine_for(pipeline).run(items)
    assert batched == alone(pipeline, items)
    assert batched[1].finish_reason == "stop"
    assert batched[2].finish_reason == "length"


def test_eos_finishes_with_stop(
    pipeline: CausalLMTextPipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = greedy_ids(pipeline, PROMPTS[0], 4)
    # The random model never picks its real EOS here, so make its fourth greedy token the EOS.
    monkeypatch.setattr(pipeline, "eos_ids", frozenset({expected[3]}))
    (result,) = engine_for(pipeline).run([TextItem(prompt=PROMPTS[0], max_new_tokens=10)])
    assert result.finish_reason == "stop"
    assert result.tokens == expected.index(expected[3]) + 1
    assert result.text == pipeline.decode(expected[: result.tokens - 1])


def test_should_stop_raises_between_steps(pipeline: CausalLMTextPipeline) -> None:
    calls = 0

    def should_stop() -> bool:
        nonlocal calls
        calls += 1
        return calls == 3

    items = [TextItem(prompt=p, max_new_tokens=10) for p in PROMPTS]
    with pytest.raises(PipelineStopped):
        engine_for(pipeline).run(items, should_stop=should_stop)
    assert calls == 3
    # A caller that never asks to stop gets the whole result.
    run = engine_for(pipeline).run
    assert run(items, should_stop=lambda: False) == run(items)


def test_results_count_the_prompt_tokens_the_model_read(pipeline: CausalLMTextPipeline) -> None:
    long_prompt = " ".join(["word"] * 500)  # read whole: 1,000 tokens, 3 short of the context
    items = [TextItem(prompt=p, max_new_tokens=6) for p in PROMPTS]
    items += [TextItem(prompt=long_prompt, max_new_tokens=3),
              TextItem(prompt=PROMPTS[0], max_new_tokens=15, stop=["e", "a", "o"])]
    long_tokens = len(pipeline.tokenizer(long_prompt)["input_ids"])
    assert long_tokens + 3 <= pipeline.context
    results = engine_for(pipeline).run(items)
    expected = [len(pipeline.tokenizer(p)["input_ids"]) for p in PROMPTS]
    assert [r.prompt_tokens for r in results] == [*expected, long_tokens, expected[0]]
    assert results[-1].finish_reason == "stop"
    # A row asked to stop counts them too, in what it had made.
    calls = 0

    def stop_soon() -> bool:
        nonlocal calls
        calls += 1
        return calls >= 3

    batch = Batch(items[:2], [None, stop_soon])
    _, stopped = asyncio.run(engine_for(pipeline).run_async(batch))
    assert (stopped.finish_reason, stopped.prompt_tokens) == ("canceled", expected[1])


def test_a_prompt_past_the_context_is_refused_not_cut(pipeline: CausalLMTextPipeline) -> None:
    long_prompt = " ".join(["word"] * 500)  # 1,000 tokens
    tokens = len(pipeline.tokenizer(long_prompt)["input_ids"])
    assert pipeline.start(TextItem(prompt=long_prompt, max_new_tokens=1024 - tokens)).prompt \
        == pipeline.tokenizer(long_prompt)["input_ids"]  # at the limit: read whole
    with pytest.raises(ContextLengthExceeded) as refused:
        pipeline.start(TextItem(prompt=long_prompt, max_new_tokens=1025 - tokens))
    e = refused.value
    assert (e.context, e.prompt, e.completion) == (1024, tokens, 1025 - tokens)
    assert e.code == "context_length_exceeded" and "1025 tokens" in e.message


def test_the_registrys_max_context_is_the_limit(model_dir: Path) -> None:
    spec = ModelSpec(name="tiny-gpt2-32", kind=ModelKind.CAUSAL_LM,
                     path=model_dir / "tiny-gpt2", max_context=32)
    pipe = build_pipeline(spec, torch.device("cpu"))
    pipe.load()
    assert pipe.context == pipe.kv_cache(1).length == 32
    with pytest.raises(ContextLengthExceeded, match="context of 32 tokens"):
        pipe.start(TextItem(prompt=PROMPTS[1], max_new_tokens=30))


@pytest.mark.parametrize("entry", ["repo id", "cache folder"])
def test_a_hugging_face_cache_snapshot_loads_offline(hub_cache: Path, entry: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    where = ({"path": "fibermill/tiny-chat", "hf_cache": hub_cache} if entry == "repo id"
             else {"path": hub_cache / "models--fibermill--tiny-chat"})
    spec = ModelSpec(name="tiny-chat", kind=ModelKind.CAUSAL_LM, **where)
    pipe = build_pipeline(spec, torch.device("cpu"))
    pipe.setup()
    assert pipe.spec.path.parent.name == "snapshots" and pipe.context == 64  # its config's
    (result,) = engine_for(pipe).run([TextItem(prompt=PROMPTS[1], max_new_tokens=6)])
    assert (result.finish_reason, result.tokens) == ("length", 6)
    with pytest.raises(ContextLengthExceeded, match="context of 64 tokens"):
        pipe.start(TextItem(prompt=PROMPTS[1], max_new_tokens=60))
