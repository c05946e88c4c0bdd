"""The committed pydoc-gpt2 demo model: it predicts held-out documentation and writes English."""

import math
import re
import string
from pathlib import Path

import pytest
import torch
from transformers import GPT2LMHeadModel

from modelbuild import pydoc_gpt2
from services.worker.pipelines.text import CausalLMTextPipeline
from shared.messages import TextItem
from shared.registry import ModelKind, ModelSpec
from tests.worker.engines import engine_for

MODEL_DIR = Path(__file__).resolve().parents[2] / "models" / "pydoc-gpt2"


@pytest.fixture(scope="module")
def pipeline() -> CausalLMTextPipeline:
    spec = ModelSpec(name="pydoc-gpt2", kind=ModelKind.CAUSAL_LM, path=MODEL_DIR)
    pipe = CausalLMTextPipeline(spec, torch.device("cpu"))
    pipe.setup()
    return pipe


@pytest.fixture(scope="module")
def documents() -> tuple[list[str], list[str]]:
    """(training, held-out) documents, split exactly as training split them."""
    return pydoc_gpt2.split(pydoc_gpt2.corpus())


def perplexity(model: GPT2LMHeadModel, tokenizer, texts: list[str]) -> float:
    """Per-token perplexity of `texts`, each scored after EOS, the way training saw documents."""
    total, count = 0.0, 0
    with torch.inference_mode():
        for text in texts:
            ids = [tokenizer.eos_token_id, *tokenizer(text)["input_ids"]][: pydoc_gpt2.CONTEXT]
            loss = pydoc_gpt2.next_token_loss(model, torch.tensor([ids]))
            total += loss.item() * (len(ids) - 1)
            count += len(ids) - 1
    return math.exp(total / count)


def test_committed_model_is_small() -> None:
    files = {p.name: p.stat().st_size for p in MODEL_DIR.iterdir()}
    assert "model.safetensors" in files and "tokenizer.json" in files
    assert sum(files.values()) < 8 * 2**20


def test_held_out_perplexity_is_far_below_chance(pipeline, documents) -> None:
    training, held_out = documents
    assert not set(training) & set(held_out)
    # Whole documents of some length, so the score is about prose, not one-word docstrings.
    texts = [doc for doc in held_out if len(doc.split()) >= 12][:12]
    assert len(texts) == 12
    vocab = len(pipeline.tokenizer)
    trained = perplexity(pipeline.model, pipeline.tokenizer, texts)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        untrained = GPT2LMHeadModel(pipeline.model.config).eval()
    chance = perplexity(untrained, pipeline.tokenizer, texts)
    # An untrained model sits near the vocabulary size; the trained one is far below both.
    assert chance > vocab / 2
    assert trained < vocab / 10
    assert trained < chance / 10


def test_greedy_continuations_are_mostly_english_words(pipeline, documents) -> None:
    training, _ = documents
    known = set(re.findall(r"[a-z]+", "\n".join(training).lower()))
    # Docstrings are mostly one short sentence, so a greedy continuation is often a few words
    # and EOS; several prompts together give enough words to judge.
    prompts = [*pydoc_gpt2.PROMPTS, "If the", "This function", "Return True if"]
    results = engine_for(pipeline).run([TextItem(prompt=p, max_new_tokens=32) for p in prompts])
    total = 0
    for result in results:
        words = [token.strip(string.punctuation) for token in result.text.split()]
        real = [word for word in words if word.isalpha() and word.lower() in known]
        assert words and len(real) >= 0.6 * len(words), result.text
        total += len(words)
    assert total >= 12
    # An untrained model copies a prompt word to the budget, which the check above can let
    # through; a trained one has learnt that a docstring ends, and emits EOS.
    assert sum(r.finish_reason == "stop" for r in results) >= len(results) / 2
