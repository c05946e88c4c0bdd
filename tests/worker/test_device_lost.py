"""A sticky device error (engine/device_faults.py) in this process, on real Redis and tiny-gpt2
or digits: the sub-requests it held go back to their queue, and the worker exits with
DEVICE_LOST for the launcher to start a clean one (drain.py, exits.py). Out of memory alone
fails its own sub-request with `out_of_memory`, and the worker serves on."""

import time

import pytest
import torch

from services.worker import exits as exits_module
from services.worker.engine.device_faults import is_out_of_memory, is_sticky
from services.worker.exits import ExitReason
from services.worker.pipelines.text import CausalLMTextPipeline
from services.worker.runtime import WorkerRuntime
from shared.celery_config import make_celery
from shared.jobstore import NewJob
from shared.messages import ImageItem, SubRequest, TextItem
from shared.registry import load_registry
from shared.settings import Settings
from tests.conftest import queued

JOB = "jl"
STICKY = [
    RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors "
                 "might be asynchronously reported at some other API call"),
    RuntimeError("CUDA error: device-side assert triggered"),
    RuntimeError("CUDA error: unspecified launch failure"),
]
NOT_STICKY = [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB"),
    RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"),
    RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    RuntimeError("The size of tensor a (4) must match the size of tensor b (5)"),
    ValueError("CUDA error: an illegal memory access"),  # not what torch raises
]


@pytest.mark.parametrize("error", STICKY)
def test_broken_cuda_contexts_are_sticky(error: Exception) -> None:
    assert is_sticky(error) and not is_out_of_memory(error)


@pytest.mark.parametrize("error", NOT_STICKY)
def test_other_errors_are_not(error: Exception) -> None:
    assert not is_sticky(error)


def test_out_of_memory_on_either_device() -> None:
    assert all(is_out_of_memory(e) for e in NOT_STICKY[:3])
    assert not any(is_out_of_memory(e) for e in [*STICKY, *NOT_STICKY[3:]])


def test_an_accelerator_error_is_sticky() -> None:
    assert is_sticky(torch.AcceleratorError("CUDA error: an illegal memory access"))


# A sub-request of each scheduling: the continuous decoder (text), the graph runner (images).
ITEMS = {
    "tiny-gpt2": TextItem(prompt="hello", max_new_tokens=5),
    "digits": ImageItem(prompt="7", width=16, height=16, steps=2, guidance_scale=2.0, seed=0),
}


@pytest.fixture(params=sorted(ITEMS))
def runtime(request, redis_url, model_dir):
    model = request.param
    settings = Settings(redis_url=redis_url, model_registry=model_dir / "registry.yaml",
                        worker_models=model, heartbeat_seconds=0.2, lease_seconds=2,
                        max_attempts=3)
    celery = make_celery(settings)
    rt = WorkerRuntime(settings, load_registry(settings.model_registry), celery)
    rt.start()
    task = "text-generation" if model == "tiny-gpt2" else "image-generation"
    rt.call(rt.store.create(NewJob(JOB, task, model, {"prompts": ["a", "b"]}, 2)))
    yield rt
    rt.stop()
    celery.close()


def _break(pipeline, monkeypatch: pytest.MonkeyPatch, error: Exception = STICKY[0]) -> None:
    """Its model's forward raises `error` from now on."""

    def broken(*args, **kwargs):
        raise error

    if isinstance(pipeline, CausalLMTextPipeline):
        monkeypatch.setattr(pipeline, "forward", broken)
    else:
        monkeypatch.setattr(pipeline.unet, "forward", broken)


def test_a_sticky_error_hands_the_work_back_and_exits(runtime: WorkerRuntime, redis_url,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    exits: list[int] = []
    monkeypatch.setattr(exits_module.os, "_exit", exits.append)
    (model,) = runtime.engines
    _break(runtime.engines[model].pipeline, monkeypatch)
    sub = SubRequest(job_id=JOB, index=0, model=model, item=ITEMS[model])
    assert runtime.handle(sub) == "handed_back"
    deadline = time.monotonic() + 10
    while not exits:
        assert time.monotonic() < deadline, "the worker never exited"
        time.sleep(0.01)
    assert exits == [ExitReason.DEVICE_LOST]
    assert len(runtime.flights) == 0
    assert queued(redis_url, model) == 1  # back in its queue
    assert runtime.call(runtime.store.results(JOB)) == {}
    # Its attempt stays charged, as a lost worker's would: one that breaks every device it
    # runs on is dead-lettered after max_attempts instead of coming back forever.
    assert runtime.call(runtime.store.attempts(JOB, 0)) == 1
    # Taken after the failure: straight back, never run.
    assert runtime.handle(sub.model_copy(update={"index": 1})) == "handed_back"


def test_out_of_memory_alone_is_stored_as_such_and_the_worker_serves_on(
        runtime: WorkerRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    exits: list[int] = []
    monkeypatch.setattr(exits_module.os, "_exit", exits.append)
    (model,) = runtime.engines
    _break(runtime.engines[model].pipeline, monkeypatch, NOT_STICKY[0])
    sub = SubRequest(job_id=JOB, index=0, model=model, item=ITEMS[model])
    assert runtime.handle(sub) == "failed"
    error = runtime.call(runtime.store.results(JOB))[0].error
    assert error.code == "out_of_memory" and "ran out of memory alone" in error.message
    assert exits == [] and not runtime.drainer.expired
