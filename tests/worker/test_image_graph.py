"""The image pipelines as operator graphs: one device sync per batch, buffer leases returned
however a batch ends, pooled buffers for batches the pool was sized for, and phase timings."""

import io

import numpy as np
import pytest
from PIL import Image
from prometheus_client import REGISTRY

from services.worker import metrics
from services.worker.engine import sync
from services.worker.engine.stopped import PipelineStopped
from shared.messages import ImageItem
from tests.worker.engines import engine_for

PHASES = ["prepare", "encode", "denoise", "decode", "to_host", "png", "collect"]


def digit(label=3, seed=0, steps=8, size=16, guidance=2.0):
    return ImageItem(
        prompt="x",
        width=size,
        height=size,
        steps=steps,
        guidance_scale=guidance,
        seed=seed,
        class_label=label,
    )


def picture(seed=0, negative="", width=64, height=64, steps=2):
    return ImageItem(
        prompt="a red cube",
        negative_prompt=negative,
        width=width,
        height=height,
        steps=steps,
        guidance_scale=5.0,
        seed=seed,
    )


@pytest.fixture(params=["digits_pipeline", "sd_pipeline", "sdxl_pipeline"])
def case(request):
    """A pipeline and a maker of small items at its pooled (default) size."""
    pipeline = request.getfixturevalue(request.param)
    make = digit if request.param == "digits_pipeline" else picture
    return pipeline, make


def pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png))).astype(int)


def leases(pipeline, outcome: str) -> float:
    return metrics.BUFFER_LEASES.labels(pipeline.spec.name, outcome)._value.get()


def phase_count(pipeline, phase: str) -> float:
    labels = {"model": pipeline.spec.name, "phase": phase}
    return REGISTRY.get_sample_value("fibermill_phase_duration_seconds_count", labels) or 0.0


def assert_all_free(pipeline) -> None:
    assert pipeline.pool.pooled_sets > 0
    assert pipeline.pool.free_sets == pipeline.pool.pooled_sets
    assert pipeline.pool.adhoc_live == 0


def test_graph_runs_the_phases_on_their_executors(case):
    pipeline, _ = case
    executors = {name: op.executor for name, op in pipeline.graph.operators.items()}
    assert executors == {
        "prepare": "cpu",
        "encode": "device",
        "denoise": "device",
        "decode": "device",
        "to_host": "device",
        "png": "cpu",
        "collect": "cpu",
    }


@pytest.mark.parametrize("n", [1, 4])
def test_one_device_sync_per_batch(case, n):
    pipeline, make = case
    name = pipeline.spec.name
    before, before_all = sync.count(name, "output"), sync.count(name)
    results = engine_for(pipeline).run([make(seed=s) for s in range(n)])
    assert len(results) == n
    assert sync.count(name, "output") - before == 1
    assert sync.count(name) - before_all == 1


def test_pool_covers_capacities_up_to_max_batch_at_the_default_size(case):
    pipeline, _ = case
    capacities = sorted({key[0] for key in pipeline.pool.buckets()})
    assert capacities[0] == 1
    assert capacities[-1] >= pipeline.spec.max_batch
    assert capacities == [1 << k for k in range(len(capacities))]
    assert pipeline.pool.pooled_sets == len(capacities) * pipeline.spec.pool_sets


def test_batch_within_pool_capacity_leases_no_adhoc_set(case):
    pipeline, make = case
    adhoc, pooled = leases(pipeline, "adhoc"), leases(pipeline, "pooled")
    engine_for(pipeline).run([make(seed=s) for s in range(3)])
    assert leases(pipeline, "adhoc") == adhoc
    assert leases(pipeline, "pooled") == pooled + 1
    assert_all_free(pipeline)


def test_batch_outside_the_pool_leases_adhoc_and_lets_it_go(digits_pipeline, sd_pipeline):
    adhoc = leases(digits_pipeline, "adhoc")
    largest = max(key[0] for key in digits_pipeline.pool.buckets())
    results = engine_for(digits_pipeline).run([digit(seed=s, steps=2) for s in range(largest + 1)])
    assert len(results) == largest + 1
    assert leases(digits_pipeline, "adhoc") == adhoc + 1
    assert_all_free(digits_pipeline)

    adhoc = leases(sd_pipeline, "adhoc")
    [result] = engine_for(sd_pipeline).run([picture(width=96, height=64)])
    assert pixels(result.png).shape == (64, 96, 3)
    assert leases(sd_pipeline, "adhoc") == adhoc + 1
    assert_all_free(sd_pipeline)


def test_sets_are_free_after_an_operator_fails(digits_pipeline):
    with pytest.raises(ValueError, match="out of range"):
        engine_for(digits_pipeline).run([digit(label=1), digit(label=10)])
    assert_all_free(digits_pipeline)
    # And the pipeline runs on afterwards.
    assert len(engine_for(digits_pipeline).run([digit(label=1)])) == 1
    assert_all_free(digits_pipeline)


def test_sets_are_free_after_a_stop(case):
    pipeline, make = case
    calls = []

    def should_stop():
        calls.append(1)
        return len(calls) >= 2

    with pytest.raises(PipelineStopped):
        engine_for(pipeline).run([make(seed=1), make(seed=2)], should_stop)
    assert len(calls) == 2
    assert_all_free(pipeline)


def test_sets_are_free_after_runs(case):
    pipeline, make = case
    engine_for(pipeline).run([make(seed=1)])
    engine_for(pipeline).run([make(seed=s) for s in range(5)])
    assert_all_free(pipeline)


def test_batch_of_eight_matches_each_alone(digits_pipeline):
    items = [digit(label=i, seed=300 + i) for i in range(8)]
    alone = [pixels(engine_for(digits_pipeline).run([i])[0].png) for i in items]
    adhoc = leases(digits_pipeline, "adhoc")
    batched = engine_for(digits_pipeline).run(items)
    assert leases(digits_pipeline, "adhoc") == adhoc
    assert [r.seed for r in batched] == [i.seed for i in items]
    for one, many in zip(alone, batched, strict=True):
        assert np.abs(pixels(many.png) - one).max() <= 1


def test_sd_batch_of_eight_matches_each_alone(sd_pipeline):
    items = [picture(seed=400 + i, negative="blurry" if i % 2 else "") for i in range(8)]
    alone = [pixels(engine_for(sd_pipeline).run([i])[0].png) for i in items]
    batched = engine_for(sd_pipeline).run(items)
    for one, many in zip(alone, batched, strict=True):
        assert np.abs(pixels(many.png) - one).max() <= 1


def test_every_phase_is_timed(case):
    pipeline, make = case
    before = {phase: phase_count(pipeline, phase) for phase in PHASES}
    engine_for(pipeline).run([make(seed=s) for s in range(3)])
    after = {phase: phase_count(pipeline, phase) for phase in PHASES}
    per_item = {"png": 3}
    assert {p: after[p] - before[p] for p in PHASES} == {p: per_item.get(p, 1) for p in PHASES}
