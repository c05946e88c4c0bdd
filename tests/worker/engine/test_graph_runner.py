"""A graph model's batch that fails (engine/graph_runner.py): its items run again alone; out of
memory alone is named as such; a sticky device error runs nothing again. On the digits DDPM,
with its UNet made to raise."""

import asyncio

import pytest
import torch

from services.worker.engine.batcher import Pending
from services.worker.engine.device_faults import DeviceLost, OutOfDeviceMemory
from services.worker.engine.graph_runner import GraphRunner
from services.worker.engine.results import ImageResult
from services.worker.pipelines.image import ClassDDPMImagePipeline
from shared.messages import ImageItem

DIGITS = ["3", "7", "5"]
POISON = 7  # the class label whose batches raise


def _item(digit: str) -> ImageItem:
    return ImageItem(prompt=digit, width=16, height=16, steps=2, guidance_scale=2.0, seed=1)


class Raising:
    """The UNet's forward, raising `error` on every batch that holds the poisoned label."""

    def __init__(self, unet: torch.nn.Module, error: Exception) -> None:
        self.forward = unet.forward
        self.error = error
        self.raised = 0

    def __call__(self, *args, class_labels: torch.Tensor, **kwargs):
        if (class_labels == POISON).any():
            self.raised += 1
            raise self.error
        return self.forward(*args, class_labels=class_labels, **kwargs)


def _run_group(pipeline: ClassDDPMImagePipeline, error: Exception,
               monkeypatch: pytest.MonkeyPatch) -> tuple[list, Raising]:
    raising = Raising(pipeline.unet, error)
    monkeypatch.setattr(pipeline.unet, "forward", raising)

    async def run() -> list:
        loop = asyncio.get_running_loop()
        group = [Pending(_item(d), None, None, loop.create_future()) for d in DIGITS]
        await asyncio.wait_for(GraphRunner(pipeline).run_group(group), 60)
        return await asyncio.gather(*(p.future for p in group), return_exceptions=True)

    return asyncio.run(run()), raising


@pytest.mark.parametrize("error", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"),
])
def test_an_item_out_of_memory_alone_fails_as_such_and_the_others_run(
        digits_pipeline: ClassDDPMImagePipeline, monkeypatch: pytest.MonkeyPatch,
        error: Exception) -> None:
    results, raising = _run_group(digits_pipeline, error, monkeypatch)
    assert isinstance(results[1], OutOfDeviceMemory) and results[1].__cause__ is error
    assert results[1].code == "out_of_memory"
    assert all(isinstance(r, ImageResult) for r in [results[0], results[2]])
    assert raising.raised == 2  # in the batch, then alone


def test_a_sticky_device_error_fails_the_batch_without_running_it_again(
        digits_pipeline: ClassDDPMImagePipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    error = RuntimeError("CUDA error: device-side assert triggered")
    results, raising = _run_group(digits_pipeline, error, monkeypatch)
    assert all(isinstance(r, DeviceLost) and r.__cause__ is error for r in results)
    assert raising.raised == 1


def test_each_item_hears_the_batch_it_starts_in(digits_pipeline: ClassDDPMImagePipeline
                                                ) -> None:
    """What the job's timeline and trace know of a batch (engine/start.py): each item is told,
    as the batch starts, its size and the items starting with it, after their charge."""
    heard: dict[str, tuple[list[str], int]] = {}
    charged: list[list[str]] = []

    async def on_start(tags: list[str]) -> None:
        assert not heard  # charged before anything is told it started
        charged.append(tags)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        group = []
        for i, d in enumerate(DIGITS[:2]):
            tag = f"job{i}:0"
            group.append(Pending(_item(d), None, None, loop.create_future(), tag=tag,
                                 on_batch=lambda t, n, tag=tag: heard.setdefault(tag, (t, n))))
        await asyncio.wait_for(GraphRunner(pipeline, on_start).run_group(group), 60)

    pipeline = digits_pipeline
    asyncio.run(run())
    assert charged == [["job0:0", "job1:0"]]
    assert heard == {"job0:0": (["job0:0", "job1:0"], 2), "job1:0": (["job0:0", "job1:0"], 2)}
