"""The architecture matrix: each causal-LM architecture the text pipeline loads, decoded by the
engine's continuous decoder with prompts of different lengths batched together, gives every
row the greedy tokens of transformers' own `generate` on that prompt alone."""

import asyncio
from pathlib import Path

import pytest
import torch

from services.worker import metrics
from services.worker.engine.engine import Engine
from services.worker.engine.text_cache import PAGE_TOKENS
from services.worker.pipelines.factory import build_pipeline
from services.worker.pipelines.text import CausalLMTextPipeline
from shared.messages import TextItem
from shared.registry import ModelKind, ModelSpec
from tests.worker.tiny_architectures import ARCHITECTURES, build

# Of different lengths, so that the shorter ones are padded in the shared prefill.
PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog, and then",
    "Return a new list of the items",
    "If the",
    "Split the string at every comma and strip each part of its whitespace",
]
NEW_TOKENS = 12


@pytest.fixture(scope="session")
def architecture_dirs(model_dir: Path, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("architectures")
    dirs = {}
    for name in ARCHITECTURES:
        build(name, model_dir / "tiny-gpt2", root / name)
        dirs[name] = root / name
    return dirs


def _generate(pipe: CausalLMTextPipeline, prompt: str) -> list[int]:
    ids = pipe.tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        out = pipe.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                  pad_token_id=pipe.pad_id)
    return out[0, ids.shape[1]:].tolist()


def _loaded(architecture: str, dirs: dict[str, Path], prompts: list[str] = PROMPTS
            ) -> tuple[CausalLMTextPipeline, list[str]]:
    """The architecture's pipeline, and `generate`'s text for each prompt alone."""
    spec = ModelSpec(name=f"tiny-{architecture}", kind=ModelKind.CAUSAL_LM,
                     path=dirs[architecture], max_batch=len(PROMPTS))
    pipe = build_pipeline(spec, torch.device("cpu"))
    assert isinstance(pipe, CausalLMTextPipeline)
    pipe.setup()
    assert pipe.model.config.model_type == architecture.replace("-", "_")
    expected = [pipe.decode(_generate(pipe, p)) for p in prompts]
    # min_new_tokens kept EOS out of `generate`'s tokens; the decoder must run as long.
    pipe.eos_ids = frozenset()
    return pipe, expected


def _items() -> list[TextItem]:
    return [TextItem(prompt=p, max_new_tokens=NEW_TOKENS) for p in PROMPTS]


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_batched_greedy_rows_equal_generate_alone(architecture: str,
                                                  architecture_dirs: dict[str, Path]) -> None:
    pipe, expected = _loaded(architecture, architecture_dirs)
    results = Engine(pipe).run(_items())
    assert [r.tokens for r in results] == [NEW_TOKENS] * len(PROMPTS)
    assert [r.text for r in results] == expected


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_rows_joining_while_others_decode_equal_generate_alone(
        architecture: str, architecture_dirs: dict[str, Path]) -> None:
    """Each prompt arrives a few steps after the one before: rows of different ages share
    every decode step."""
    pipe, expected = _loaded(architecture, architecture_dirs)
    engine = Engine(pipe)
    decoder = engine.scheduling

    async def staggered() -> list:
        futures = []
        for item in _items():
            rounds = decoder.rounds
            futures.append(asyncio.ensure_future(engine.submit(item)))
            while decoder.rounds < rounds + 3 and not all(f.done() for f in futures):
                await asyncio.sleep(0.0005)
        return await asyncio.wait_for(asyncio.gather(*futures), 60)

    results = asyncio.run(staggered())
    assert [r.text for r in results] == expected


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_rows_sharing_cached_prompt_pages_equal_generate_alone(
        architecture: str, architecture_dirs: dict[str, Path]) -> None:
    """Prompts with one long beginning: the first run caches its pages, and the rows after it
    compute only their own rest over those pages (rotary positions, grouped key heads and
    sliding windows included)."""
    system = "Answer as briefly as you can, in plain words, and never more than asked. " * 2
    prompts = [system + p for p in PROMPTS]
    pipe, expected = _loaded(architecture, architecture_dirs, prompts)
    engine = Engine(pipe)
    hits = metrics.KV_PREFIX_HIT_TOKENS.labels(pipe.spec.name)._value.get()
    items = [TextItem(prompt=p, max_new_tokens=NEW_TOKENS) for p in prompts]
    first = engine.run(items[:1])
    rest = engine.run(items[1:])
    assert [r.text for r in first + rest] == expected
    assert metrics.KV_PREFIX_HIT_TOKENS.labels(pipe.spec.name)._value.get() - hits >= \
        2 * PAGE_TOKENS * (len(prompts) - 1)
