"""GPT-2's lean forward: the model's own logits bit for bit, and the library's forward for the
GPT-2s it does not reproduce."""

from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

from services.worker.engine.text_cache import PAGE_TOKENS, pages_for
from services.worker.pipelines.text import CausalLMTextPipeline
from services.worker.pipelines.text_gpt2 import GPT2Forward, fits
from shared.messages import TextItem
from shared.registry import ModelKind, ModelSpec
from shared.settings import REPO_ROOT
from tests.worker.engines import engine_for
from tests.worker.text_reference import alone

PROMPTS = ["Hello there", "Return a new list of the items in order", "A"]


def _pipeline(path: Path) -> CausalLMTextPipeline:
    spec = ModelSpec(name="gpt2-lean", kind=ModelKind.CAUSAL_LM, path=path, max_batch=4)
    pipe = CausalLMTextPipeline(spec, torch.device("cpu"))
    pipe.setup()
    return pipe


@pytest.fixture(scope="module", params=["tiny-gpt2", "pydoc-gpt2"])
def pipeline(request, model_dir: Path) -> CausalLMTextPipeline:
    root = model_dir if request.param == "tiny-gpt2" else REPO_ROOT / "models"
    return _pipeline(root / request.param)


def _library(pipe: CausalLMTextPipeline, ids, mask, positions, cache) -> torch.Tensor:
    """The pipeline's own forward with the lean path off: the model's `forward`."""
    lean, pipe.lean = pipe.lean, None
    try:
        return pipe.forward(ids, mask, positions, cache)
    finally:
        pipe.lean = lean


def test_a_gpt2_runs_the_lean_forward(pipeline: CausalLMTextPipeline) -> None:
    assert isinstance(pipeline.lean, GPT2Forward)


@torch.inference_mode()
def test_prefill_and_decode_logits_are_the_models_bit_for_bit(
        pipeline: CausalLMTextPipeline) -> None:
    prompts = [pipeline.tokenizer(p)["input_ids"] for p in PROMPTS]
    rows, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((rows, width), pipeline.pad_id)
    real = torch.zeros((rows, width), dtype=torch.bool)
    for i, p in enumerate(prompts):  # left padded, as the decoder lays prompts out
        ids[i, width - len(p):] = torch.tensor(p)
        real[i, width - len(p):] = True
    causal = torch.ones((width, width), dtype=torch.bool).tril_()
    mask = ((causal[None] & real[:, None, :]) | torch.eye(width, dtype=torch.bool)[None])[:, None]
    positions = (real.long().cumsum(-1) - 1).clamp_(min=0)
    lean_cache, lib_cache = pipeline.kv_cache(rows), pipeline.kv_cache(rows)
    for cache in (lean_cache, lib_cache):
        for i, p in enumerate(prompts):
            cache.grow(i, len(p) + 5)
        cache.for_prefill(slice(0, rows), positions, real)
    lean = pipeline.forward(ids, mask, positions, lean_cache)
    lib = _library(pipeline, ids, mask, positions, lib_cache)
    assert torch.equal(lean, lib)
    nxt, pos = lean.argmax(-1), positions[:, -1] + 1
    for step in range(5):
        pages = pages_for(width + step + 1)
        for cache in (lean_cache, lib_cache):
            cache.for_decode(pos.tolist(), pos, pages)
        step_mask = (torch.arange(pages * PAGE_TOKENS) <= pos[:, None])[:, None, None]
        lean = pipeline.forward(nxt[:, None], step_mask, pos[:, None], lean_cache)
        lib = _library(pipeline, nxt[:, None], step_mask, pos[:, None], lib_cache)
        assert torch.equal(lean, lib)
        nxt, pos = lean.argmax(-1), pos + 1
    for k_lean, k_lib in zip(lean_cache.keys, lib_cache.keys, strict=True):
        assert torch.equal(k_lean, k_lib)


def test_only_gpt2s_with_sdpa_self_attention_fit() -> None:
    small = dict(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    assert fits(GPT2LMHeadModel(GPT2Config(**small)))
    eager = GPT2LMHeadModel(GPT2Config(**small, attn_implementation="eager"))
    assert not fits(eager)
    cross = GPT2LMHeadModel(GPT2Config(**small, add_cross_attention=True))
    assert not fits(cross)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2))
    assert not fits(llama)


def test_a_model_it_does_not_fit_decodes_through_the_library(model_dir: Path) -> None:
    pipe = _pipeline(model_dir / "tiny-gpt2")
    pipe.model = AutoModelForCausalLM.from_pretrained(
        model_dir / "tiny-gpt2", local_files_only=True, attn_implementation="eager").eval()
    pipe.lean = GPT2Forward(pipe.model) if fits(pipe.model) else None
    assert pipe.lean is None
    calls = []
    pipe.model.register_forward_hook(lambda *args: calls.append(1))
    items = [TextItem(prompt=p, max_new_tokens=6 + i) for i, p in enumerate(PROMPTS)]
    batched = engine_for(pipe).run(items)
    assert calls  # the model's own forward ran
    assert batched == alone(pipe, items)
    assert [r.tokens for r in batched] == [6, 7, 8]
