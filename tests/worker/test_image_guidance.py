"""Guidance scales are per item: items differing only in their scale share a batch (and each
gets exactly its own image); only whether guidance runs at all separates batches."""

import asyncio
import io

import numpy as np
import pytest
import torch
from diffusers import UNet2DConditionModel
from PIL import Image
from prometheus_client import REGISTRY

from modelbuild.tiny_diffusion import build_tiny_sd
from services.worker import metrics
from services.worker.engine.engine import Engine
from services.worker.pipelines.image import StableDiffusionImagePipeline
from shared.messages import ImageItem
from shared.registry import ModelSpec
from tests.worker.engines import engine_for
from tests.worker.test_image_pipelines import item

SCALES = [7.5, 5.0, 3.0]  # all guided, on every model here


def picture(guidance, seed=7, **fields):
    return item(guidance=guidance, seed=seed, **fields)


def digit(guidance, seed=7, label=3, steps=8):
    return ImageItem(
        prompt="x",
        width=16,
        height=16,
        steps=steps,
        guidance_scale=guidance,
        seed=seed,
        class_label=label,
    )


@pytest.fixture(params=["digits_pipeline", "sd_pipeline", "sdxl_pipeline"])
def case(request):
    pipeline = request.getfixturevalue(request.param)
    make = digit if request.param == "digits_pipeline" else picture
    return pipeline, make


@pytest.fixture(scope="module")
def lcm_pipeline(tiny_sd_dir, tmp_path_factory) -> StableDiffusionImagePipeline:
    """The tiny SD model with a UNet conditioned on the guidance scale (as LCM's): it never
    runs classifier-free guidance, the scale goes in through `timestep_cond`."""
    path = tmp_path_factory.mktemp("models") / "tiny-lcm"
    build_tiny_sd(path)
    config = dict(UNet2DConditionModel.load_config(path / "unet"))
    config["time_cond_proj_dim"] = 8
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        UNet2DConditionModel.from_config(config).save_pretrained(path / "unet")
    spec = ModelSpec(
        name="tiny-lcm",
        kind="stable-diffusion",
        path=path,
        defaults={"width": 64, "height": 64, "steps": 4},
    )
    pipeline = StableDiffusionImagePipeline(spec, torch.device("cpu"))
    pipeline.setup()
    return pipeline


def pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png))).astype(int)


def graph_runs(pipeline) -> float:
    """Batches the pipeline's graph has run (each runs prepare once)."""
    labels = {"model": pipeline.spec.name, "phase": "prepare"}
    return REGISTRY.get_sample_value("fibermill_phase_duration_seconds_count", labels) or 0.0


def assert_one_batch_matches_each_alone(pipeline, items):
    alone = [pixels(engine_for(pipeline).run([i])[0].png) for i in items]
    # The scale matters (same seed and prompt, different images), so a batch that ran every
    # item at one scale could not match.
    assert all(np.abs(a - alone[0]).max() > 1 for a in alone[1:])
    runs = graph_runs(pipeline)
    # Raised ValueError while the scale was in the batch key.
    batched = engine_for(pipeline).run(items)
    assert graph_runs(pipeline) - runs == 1
    assert [r.seed for r in batched] == [i.seed for i in items]
    for one, many in zip(alone, batched, strict=True):
        assert np.abs(pixels(many.png) - one).max() <= 1


def test_guidance_scales_share_one_batch(case):
    pipeline, make = case
    items = [make(g) for g in SCALES]
    assert len({pipeline.batch_key(i) for i in items}) == 1
    assert_one_batch_matches_each_alone(pipeline, items)


def test_mixed_scales_with_other_fields_match_alone(sd_pipeline):
    items = [
        picture(7.5, seed=1, negative="blurry"),
        picture(3.0, seed=2, prompt="a blue sphere on grass"),
        picture(5.0, seed=3, negative="dark, low quality"),
        picture(7.5, seed=4, prompt="seven green dogs"),
    ]
    alone = [pixels(engine_for(sd_pipeline).run([i])[0].png) for i in items]
    for one, many in zip(alone, engine_for(sd_pipeline).run(items), strict=True):
        assert np.abs(pixels(many.png) - one).max() <= 1


def test_scale_conditioned_unet_batches_scales_per_item(lcm_pipeline):
    items = [picture(g) for g in [*SCALES, 1.0]]
    assert not any(lcm_pipeline.is_guided(i.guidance_scale) for i in items)
    assert len({lcm_pipeline.batch_key(i) for i in items}) == 1
    assert_one_batch_matches_each_alone(lcm_pipeline, items)


@pytest.mark.parametrize("name", ["sd_pipeline", "sdxl_pipeline"])
def test_guided_and_unguided_keys_differ_for_sd(request, name):
    pipeline = request.getfixturevalue(name)
    guided = {pipeline.batch_key(picture(g)) for g in [7.5, 3.0, 1.5]}
    unguided = {pipeline.batch_key(picture(g)) for g in [1.0, 0.5]}
    assert len(guided) == 1
    assert len(unguided) == 1
    assert guided != unguided
    with pytest.raises(ValueError, match="share"):
        engine_for(pipeline).run([picture(7.5), picture(1.0)])


def test_guided_and_unguided_keys_differ_for_digits(digits_pipeline):
    # The class model guides at any scale but 1 (below 1 it extrapolates the other way).
    keys = {g: digits_pipeline.batch_key(digit(g)) for g in [2.0, 0.5, 1.0]}
    assert keys[2.0] == keys[0.5] != keys[1.0]
    with pytest.raises(ValueError, match="share"):
        engine_for(digits_pipeline).run([digit(2.0), digit(1.0)])


def test_prompts_seeds_and_labels_do_not_split_batches(sd_pipeline, digits_pipeline):
    pictures = [
        picture(7.5),
        picture(7.5, seed=99, prompt="a cat", negative="blurry"),
        picture(5.0, seed=3, negative="dark"),
    ]
    assert len({sd_pipeline.batch_key(i) for i in pictures}) == 1
    digits = [digit(2.0), digit(3.0, seed=5, label=8), digit(2.0, label=1)]
    assert len({digits_pipeline.batch_key(i) for i in digits}) == 1


def test_engine_batches_items_of_different_scales_together(sd_pipeline):
    engine = Engine(sd_pipeline)
    engine.scheduling.max_wait_s = 60.0  # the three are announced: none leaves before all are in
    items = [picture(g, seed=20 + k) for k, g in enumerate(SCALES)]
    alone = [pixels(engine.run([i])[0].png) for i in items]
    sizes = metrics.BATCH_SIZE.labels(sd_pipeline.spec.name)
    count, total = sum(b.get() for b in sizes._buckets), sizes._sum.get()

    async def submit_all():
        with engine.arrival() as a, engine.arrival() as b, engine.arrival() as c:
            arrivals = [a, b, c]
            return await asyncio.gather(
                *(x.submit(i) for x, i in zip(arrivals, items, strict=True))
            )

    results = asyncio.run(submit_all())
    assert sum(b.get() for b in sizes._buckets) - count == 1
    assert sizes._sum.get() - total == 3
    for one, many in zip(alone, results, strict=True):
        assert np.abs(pixels(many.png) - one).max() <= 1
