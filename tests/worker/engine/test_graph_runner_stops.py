"""A graph model's batch whose every item is asked to stop (engine/graph_runner.py) did not
fail: it is not counted as a failed batch nor logged as a warning, and nothing runs again. (A
batch that really fails still runs its items alone: test_graph_runner.py.) On the digits
DDPM."""

import asyncio
import logging

import pytest
import torch

from services.worker import metrics
from services.worker.engine.batcher import Pending
from services.worker.engine.graph_runner import GraphRunner
from services.worker.engine.stopped import PipelineStopped
from services.worker.pipelines.image import ClassDDPMImagePipeline
from shared.messages import ImageItem

MODEL = "digits"


def _item(digit: str) -> ImageItem:
    return ImageItem(prompt=digit, width=16, height=16, steps=6, guidance_scale=2.0, seed=1)


def _after(polls: int):
    """A stop hook that asks to stop from its `polls`-th poll on: a cancel of a running item."""
    seen = 0

    def should_stop() -> bool:
        nonlocal seen
        seen += 1
        return seen >= polls

    return should_stop


def _value(counter, model: str) -> float:
    return counter.labels(model)._value.get()


class Counting:
    """The UNet's forward, counted."""

    def __init__(self, unet: torch.nn.Module) -> None:
        self.forward = unet.forward
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.forward(*args, **kwargs)


def _run(pipeline: ClassDDPMImagePipeline, stops) -> list:
    async def run() -> list:
        loop = asyncio.get_running_loop()
        group = [Pending(_item(d), None, stop, loop.create_future())
                 for d, stop in zip(["3", "7"], stops, strict=True)]
        await asyncio.wait_for(GraphRunner(pipeline).run_group(group), 60)
        return await asyncio.gather(*(p.future for p in group), return_exceptions=True)

    return asyncio.run(run())


def test_a_batch_stopped_by_its_items_is_no_failure(
        digits_pipeline: ClassDDPMImagePipeline, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    unet = Counting(digits_pipeline.unet)
    monkeypatch.setattr(digits_pipeline.unet, "forward", unet)
    isolated, stopped = _value(metrics.BATCHES_ISOLATED, MODEL), _value(
        metrics.BATCHES_STOPPED, MODEL)
    with caplog.at_level(logging.DEBUG, logger="services.worker.engine"):
        results = _run(digits_pipeline, [_after(2), _after(3)])
    assert all(isinstance(r, PipelineStopped) for r in results), results
    assert _value(metrics.BATCHES_ISOLATED, MODEL) == isolated
    assert _value(metrics.BATCHES_STOPPED, MODEL) == stopped + 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "stopped" in caplog.text
    # Two steps ran in the batch, and nothing ran again alone.
    assert unet.calls == 2

