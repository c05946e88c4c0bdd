"""Which dtype a model runs in (pipelines/dtypes.py), TF32 for float32 on a GPU, and what bf16
costs a text model against float32: the first step's logits within 2% of their largest
magnitude (bf16 keeps 8 bits of mantissa, 0.4% a rounding), greedy tokens equal on most
prompts."""

from pathlib import Path

import pytest
import torch

from services.worker.engine.engine import Engine
from services.worker.pipelines import dtypes
from services.worker.pipelines.dtypes import allow_tf32, resolve_dtype
from services.worker.pipelines.text import CausalLMTextPipeline
from shared.messages import TextItem
from shared.registry import ModelKind, ModelSpec
from shared.settings import REPO_ROOT
from tests.worker.engine.test_decoder import PROMPTS
from tests.worker.tiny_architectures import build

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)
# The first step's logits: bf16 against float32, at most this share of float32's largest.
LOGITS_TOLERANCE = 0.02
NEW_TOKENS = 16


@pytest.mark.parametrize(("requested", "device", "bf16", "expected"), [
    ("auto", CPU, None, torch.float32),
    ("auto", CUDA, True, torch.bfloat16),
    ("auto", CUDA, False, torch.float16),
    ("float16", CPU, None, torch.float16),
    ("bfloat16", CUDA, False, torch.bfloat16),  # asked for by name: the registry decides
    ("float32", CUDA, True, torch.float32),
])
def test_the_registrys_dtype_or_the_devices_best(requested, device, bf16, expected) -> None:
    assert resolve_dtype(requested, device, bf16_supported=bf16) == expected


def test_auto_asks_the_gpu_whether_it_has_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dtypes.torch.cuda, "is_bf16_supported", lambda: False)
    assert resolve_dtype("auto", CUDA) == torch.float16


def test_tf32_on_a_gpu_only() -> None:
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    before = matmul.fp32_precision, conv.fp32_precision
    try:
        matmul.fp32_precision = "ieee"
        allow_tf32(CPU)
        assert matmul.fp32_precision == "ieee"
        allow_tf32(CUDA)  # flags only: nothing runs on the device
        assert matmul.fp32_precision == "tf32" and conv.fp32_precision == "tf32"
    finally:
        matmul.fp32_precision, conv.fp32_precision = before


def _pipeline(path: Path, dtype: str) -> CausalLMTextPipeline:
    spec = ModelSpec(name=f"{path.name}-{dtype}", kind=ModelKind.CAUSAL_LM, path=path,
                     dtype=dtype)
    pipe = CausalLMTextPipeline(spec, CPU)
    pipe.load()
    pipe.prepare()
    pipe.eos_ids = frozenset()  # every row runs its whole budget, in both dtypes
    return pipe


def _decode(pipe: CausalLMTextPipeline) -> tuple[torch.Tensor, list[str]]:
    """Each prompt's first-step logits (its prefill's, in float32), and its greedy text."""
    forward, firsts = pipe.forward, []

    def recording(ids, *args):
        logits = forward(ids, *args)
        if not firsts:  # the one prefill of every row, batched together
            firsts.append(logits.float())
        return logits

    pipe.forward = recording  # type: ignore[method-assign]
    results = Engine(pipe).run([TextItem(prompt=p, max_new_tokens=NEW_TOKENS)
                                for p in PROMPTS])
    return firsts[0], [r.text for r in results]


@pytest.fixture(scope="module")
def tiny_llama(model_dir: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bf16") / "llama"
    build("llama", model_dir / "tiny-gpt2", out)
    return out


@pytest.mark.parametrize("model", ["pydoc-gpt2", "llama"])
def test_bf16_decodes_within_tolerance_of_float32(model: str, tiny_llama: Path) -> None:
    # The trained pydoc-gpt2 (GPT-2's own forward) has logits of a real model's spread;
    # the random tiny Llama runs the library's forward.
    path = REPO_ROOT / "models" / "pydoc-gpt2" if model == "pydoc-gpt2" else tiny_llama
    full, half = _pipeline(path, "float32"), _pipeline(path, "bfloat16")
    assert half.model.dtype == torch.bfloat16
    (full_logits, full_texts), (half_logits, half_texts) = _decode(full), _decode(half)
    scale = full_logits.abs().max()
    assert (half_logits - full_logits).abs().max() <= LOGITS_TOLERANCE * scale
    same = sum(a == b for a, b in zip(full_texts, half_texts, strict=True))
    assert same >= len(PROMPTS) * 3 // 4, (full_texts, half_texts)
