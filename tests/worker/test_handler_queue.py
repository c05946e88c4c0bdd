"""A sub-request stopped while it waits in its engine's queue (handler.py wires its flight's
stop to the engine): it leaves at once and never starts on the device. On real Redis, with a
one-slot tiny-gpt2 (the decoder's queue) and digits (the batcher's: a batch of another size
waits while one runs), so that the second sub-request has to wait."""

import threading
import time
from pathlib import Path

import pytest
import yaml

from services.worker.engine.batcher import Batcher
from services.worker.engine.decoder import Decoder
from services.worker.runtime import WorkerRuntime
from shared.celery_config import make_celery
from shared.jobstore import NewJob
from shared.messages import ImageItem, StopReason, SubRequest, TextItem
from shared.registry import load_registry
from shared.settings import Settings

# A long sub-request that holds the device, and a short one that must wait behind it.
ITEMS = {
    # Its budget is nearly all of the model's positions: it holds the one slot for a second
    # or more.
    "tiny-gpt2": (TextItem(prompt="a", max_new_tokens=1000),
                  TextItem(prompt="b", max_new_tokens=5)),
    "digits": (ImageItem(prompt="3", width=16, height=16, steps=1000, guidance_scale=2.0,
                         seed=0),
               ImageItem(prompt="7", width=16, height=16, steps=2, guidance_scale=2.0,
                         seed=0)),
}


@pytest.fixture(params=sorted(ITEMS))
def runtime(request, redis_url, model_dir: Path, tmp_path: Path):
    model = request.param
    registry = yaml.safe_load((model_dir / "registry.yaml").read_text())
    registry["models"]["tiny-gpt2"].update(path=str(model_dir / "tiny-gpt2"), max_batch=1)
    (tmp_path / "registry.yaml").write_text(yaml.safe_dump(registry))
    settings = Settings(redis_url=redis_url, model_registry=tmp_path / "registry.yaml",
                        worker_models=model, heartbeat_seconds=0.2, lease_seconds=5)
    celery = make_celery(settings)
    rt = WorkerRuntime(settings, load_registry(settings.model_registry), celery)
    rt.start()
    task = "text-generation" if model == "tiny-gpt2" else "image-generation"
    for job in ("long", "queued"):
        rt.call(rt.store.create(NewJob(job, task, model, {"prompts": ["a"]}, 1)))
    yield rt
    rt.stop()
    celery.close()


def _in_background(rt: WorkerRuntime, sub: SubRequest) -> dict:
    out: dict = {}
    out["thread"] = threading.Thread(target=lambda: out.setdefault("outcome", rt.handle(sub)))
    out["thread"].start()
    return out


def _until(check, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def _cancel(rt: WorkerRuntime, job: str) -> int:
    """What the cancel listener does when a job is canceled."""

    async def stop() -> int:
        return rt.flights.stop_job(job, StopReason.CANCELED)

    return rt.call(stop())


def test_a_sub_request_canceled_while_queued_never_starts(runtime: WorkerRuntime) -> None:
    (model,) = runtime.engines
    scheduling = runtime.engines[model].scheduling

    def running() -> bool:
        if isinstance(scheduling, Decoder):
            return bool(scheduling.running)
        assert isinstance(scheduling, Batcher)
        return scheduling.running > 0

    def queued() -> bool:
        if isinstance(scheduling, Decoder):
            return bool(scheduling.waiting)
        assert isinstance(scheduling, Batcher)
        return bool(scheduling.pending)

    long, short = (SubRequest(job_id=job, index=0, model=model, item=item)
                   for job, item in zip(("long", "queued"), ITEMS[model], strict=True))
    holding = _in_background(runtime, long)
    _until(running, "the long sub-request never started")
    waiting = _in_background(runtime, short)
    _until(queued, "the second sub-request never reached the queue")
    assert _cancel(runtime, "queued") == 1
    waiting["thread"].join(5)
    assert waiting["outcome"] == "canceled"
    assert running() and not queued()  # it left while the device was still taken
    assert runtime.call(runtime.store.attempts("queued", 0)) == 0  # never announced to start
    assert runtime.call(runtime.store.attempts("long", 0)) == 1
    _cancel(runtime, "long")
    holding["thread"].join(10)
    assert holding["outcome"] == "canceled"
