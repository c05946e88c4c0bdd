"""Stable Diffusion and SDXL pipelines on tiny random models: sizes, batch invariance, stops."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from services.worker.engine.stopped import PipelineStopped
from shared.messages import ImageItem
from tests.worker.engines import engine_for

KINDS = ["sd_pipeline", "sdxl_pipeline"]


@pytest.fixture(params=KINDS)
def pipeline(request):
    return request.getfixturevalue(request.param)


def item(prompt="a red cube", seed=0, negative="", width=64, height=64, steps=4, guidance=5.0):
    return ImageItem(
        prompt=prompt,
        negative_prompt=negative,
        width=width,
        height=height,
        steps=steps,
        guidance_scale=guidance,
        seed=seed,
    )


def pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png))).astype(int)


@pytest.mark.parametrize(("width", "height"), [(64, 64), (96, 64), (32, 128)])
def test_png_has_requested_size(pipeline, width, height):
    [result] = engine_for(pipeline).run([item(width=width, height=height, seed=3)])
    image = Image.open(io.BytesIO(result.png))
    assert image.format == "PNG"
    assert image.mode == "RGB"
    assert image.size == (width, height)
    assert (result.width, result.height, result.seed) == (width, height, 3)


def test_batched_matches_alone(pipeline):
    items = [
        item("a red cube", seed=1),
        item("a blue sphere on grass", seed=2, negative="blurry"),
        item("a red cube", seed=3, negative="dark, low quality"),
    ]
    alone = [pixels(engine_for(pipeline).run([i])[0].png) for i in items]
    batched = engine_for(pipeline).run(items)
    assert [r.seed for r in batched] == [1, 2, 3]
    for one, many in zip(alone, batched, strict=True):
        assert np.abs(pixels(many.png) - one).max() <= 1


@pytest.mark.parametrize("negative", ["", "blurry"])
def test_matches_the_diffusers_pipeline_itself(pipeline, negative):
    [ours] = engine_for(pipeline).run([item("a red cube", seed=4, negative=negative)])
    # diffusers' own call, as documented: no negative prompt means None, not "".
    reference = pipeline.pipe(
        "a red cube",
        negative_prompt=negative or None,
        width=64,
        height=64,
        num_inference_steps=4,
        guidance_scale=5.0,
        generator=torch.Generator(device="cpu").manual_seed(4),
    ).images[0]
    assert np.abs(pixels(ours.png) - np.asarray(reference).astype(int)).max() <= 1


def test_same_seed_repeats_exactly(pipeline):
    first = engine_for(pipeline).run([item(seed=11)])[0].png
    assert engine_for(pipeline).run([item(seed=11)])[0].png == first


def test_different_seeds_differ(pipeline):
    a, b = engine_for(pipeline).run([item(seed=1), item(seed=2)])
    assert np.abs(pixels(a.png) - pixels(b.png)).max() > 10


def test_prompts_condition_the_image(pipeline):
    a, b = engine_for(pipeline).run([item("a red cube", seed=5), item("seven green dogs", seed=5)])
    assert a.png != b.png


def test_unguided_batch_matches_alone(pipeline):
    items = [item("a red cube", seed=1, guidance=1.0), item("a cat", seed=2, guidance=1.0)]
    alone = [pixels(engine_for(pipeline).run([i])[0].png) for i in items]
    for one, many in zip(alone, engine_for(pipeline).run(items), strict=True):
        assert np.abs(pixels(many.png) - one).max() <= 1


def test_should_stop_ends_the_run_early(pipeline):
    calls = []

    def should_stop():
        calls.append(1)
        return len(calls) >= 3

    with pytest.raises(PipelineStopped):
        engine_for(pipeline).run([item(steps=10)], should_stop)
    assert len(calls) == 3


def test_should_stop_false_runs_to_the_end(pipeline):
    calls = []
    result = engine_for(pipeline).run([item(steps=4)], lambda: calls.append(1) or False)
    assert len(result) == 1
    assert len(calls) >= 4


def test_items_with_different_settings_are_refused(pipeline):
    with pytest.raises(ValueError, match="share"):
        engine_for(pipeline).run([item(steps=4), item(steps=5)])


def test_size_not_a_multiple_of_the_vae_scale_is_refused(pipeline):
    with pytest.raises(ValueError, match="multiples of 8"):
        engine_for(pipeline).run([item(width=60)])
