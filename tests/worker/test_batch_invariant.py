"""Batch-invariant layers: the same values as the layers they replace, and a sample's bytes the
same whatever runs beside it, through the digits UNet and through whole image pipelines."""

import copy
from pathlib import Path

import pytest
import torch
from diffusers import UNet2DModel
from torch import nn

from services.worker.pipelines.batch_invariant import (
    PairedConv2d,
    PairedGroupNorm,
    SampleLinear,
    SamplePointwiseConv2d,
    make_batch_invariant,
)
from services.worker.pipelines.image import (
    StableDiffusionImagePipeline,
    StableDiffusionXLImagePipeline,
)
from shared.messages import ImageItem
from shared.registry import ModelRegistry, ModelSpec
from tests.worker.engines import engine_for

from .conftest import CPU, TINY_DEFAULTS

MODELS = Path(__file__).resolve().parents[2] / "models"


@pytest.fixture
def threads():
    """Sets torch's intra-op threads for one test and puts the count back after it."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def swapped(module: nn.Module) -> nn.Module:
    make_batch_invariant(module)
    return module


@pytest.mark.parametrize("shape", [(5, 12), (3, 7, 12)])
@pytest.mark.parametrize("bias", [True, False])
def test_sample_linear_computes_a_linear(shape, bias):
    torch.manual_seed(0)
    plain = nn.Linear(12, 9, bias=bias)
    layer = swapped(nn.Sequential(plain)).eval()[0]
    x = torch.randn(*shape)
    assert type(layer) is SampleLinear
    with torch.no_grad():
        assert torch.allclose(layer(x), nn.functional.linear(x, plain.weight, plain.bias),
                              atol=1e-6)


@pytest.mark.parametrize("n", [1, 3])
def test_swapped_convolutions_and_norms_compute_what_they_replace(n):
    torch.manual_seed(0)
    reference = nn.ModuleList(
        [nn.Conv2d(8, 6, 1), nn.Conv2d(8, 6, 3, padding=1), nn.GroupNorm(4, 8)])
    model = swapped(copy.deepcopy(reference))
    assert [type(m) for m in model] == [SamplePointwiseConv2d, PairedConv2d, PairedGroupNorm]
    for memory_format in (torch.contiguous_format, torch.channels_last):
        x = torch.randn(n, 8, 5, 5).contiguous(memory_format=memory_format)
        with torch.no_grad():
            for ref, layer in zip(reference, model, strict=True):
                out = layer(x)
                assert out.shape == ref(x).shape
                assert torch.allclose(out, ref(x), atol=1e-5)


def test_strided_and_grouped_convolutions_are_not_treated_as_pointwise():
    model = swapped(nn.ModuleList([nn.Conv2d(4, 4, 1, stride=2), nn.Conv2d(4, 4, 1, groups=2)]))
    assert [type(m) for m in model] == [PairedConv2d, PairedConv2d]


@pytest.fixture(scope="module")
def digits_unet() -> UNet2DModel:
    unet = UNet2DModel.from_pretrained(MODELS / "digits", subfolder="unet",
                                       local_files_only=True).eval()
    counts = {t: sum(type(m) is t for m in unet.modules())
              for t in (nn.Linear, nn.Conv2d, nn.GroupNorm)}
    assert make_batch_invariant(unet) == sum(counts.values())
    assert not any(type(m) in counts for m in unet.modules())
    return unet


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("rows", [1, 2])
def test_digits_unet_rows_are_the_same_alone_and_batched(digits_unet, threads, n_threads, rows):
    # One row is an unguided item alone, two a guided one; batches of up to 32 guided items.
    threads(n_threads)
    torch.manual_seed(rows)
    x = torch.randn(rows, 1, 16, 16)
    labels = torch.tensor([7, 10][:rows])
    with torch.inference_mode():
        alone = digits_unet(x, torch.tensor(500), class_labels=labels).sample
        for batch in (2, 3, 4, 8, 16, 32, 64):
            if batch <= rows:
                continue
            at = batch // 2  # somewhere in the middle: the rows before it must not matter
            xs = torch.randn(batch, 1, 16, 16)
            xs[at:at + rows] = x
            ls = torch.randint(0, 11, (batch,))
            ls[at:at + rows] = labels
            out = digits_unet(xs, torch.tensor(500), class_labels=ls).sample
            assert torch.equal(out[at:at + rows], alone), f"{batch} rows"


def test_the_shipped_digits_model_is_batch_invariant():
    # The REST contract holds image i of a job to the same bytes as its prompt and seed alone.
    assert ModelRegistry.load(MODELS / "registry.yaml").get("digits").batch_invariant


def test_a_text_model_asking_for_it_is_refused_by_name():
    with pytest.raises(ValueError, match="gpt: `batch_invariant` is for image models"):
        ModelSpec(name="gpt", kind="causal-lm", path=Path("x"), batch_invariant=True)


def tiny_item(prompt: str, seed: int) -> ImageItem:
    return ImageItem(prompt=prompt, seed=seed, guidance_scale=7.5, **TINY_DEFAULTS)


@pytest.fixture(scope="module", params=["tiny-sd", "tiny-sdxl"])
def invariant_pipeline(request, model_dir):
    cls = {"tiny-sd": StableDiffusionImagePipeline,
           "tiny-sdxl": StableDiffusionXLImagePipeline}[request.param]
    kind = {"tiny-sd": "stable-diffusion", "tiny-sdxl": "stable-diffusion-xl"}[request.param]
    spec = ModelSpec(name=request.param, kind=kind, path=model_dir / request.param,
                     defaults=TINY_DEFAULTS, max_batch=8, batch_invariant=True)
    pipeline = cls(spec, CPU)
    pipeline.setup()
    return pipeline


def test_latent_diffusion_images_are_the_same_bytes_alone_and_batched(invariant_pipeline):
    # Without the swap, on an AMD EPYC, seeds 2 and 4 of tiny-sd and 0, 1, 2 and 9 of tiny-sdxl
    # came out of some of these batches as other bytes than alone.
    for seed in (0, 1, 2, 4, 9):
        alone = engine_for(invariant_pipeline).run([tiny_item("a red cube", seed)])[0].png
        others = [tiny_item("a blue ball" if k % 2 else "x", 100 + k) for k in range(7)]
        for batch, at in ((2, 1), (3, 0), (8, 4)):
            items = others[:batch - 1]
            items.insert(at, tiny_item("a red cube", seed))
            assert engine_for(invariant_pipeline).run(items)[at].png == alone, (seed, batch)
