"""A sub-request stopped while it waits in its engine's queue (handler.py wires its flight's
stop to the engine): it leaves at once and never starts on the device. On real Redis and a
one-slot tiny-gpt2, so that a second sub-request has to wait."""

import threading
import time
from pathlib import Path

import pytest
import yaml

from services.worker.runtime import WorkerRuntime
from shared.celery_config import make_celery
from shared.jobstore import NewJob
from shared.messages import StopReason, SubRequest, TextItem
from shared.registry import load_registry
from shared.settings import Settings


@pytest.fixture
def runtime(redis_url, model_dir: Path, tmp_path: Path):
    registry = yaml.safe_load((model_dir / "registry.yaml").read_text())
    spec = registry["models"]["tiny-gpt2"]
    spec.update(path=str(model_dir / "tiny-gpt2"), max_batch=1)
    (tmp_path / "registry.yaml").write_text(yaml.safe_dump(registry))
    settings = Settings(redis_url=redis_url, model_registry=tmp_path / "registry.yaml",
                        worker_models="tiny-gpt2", heartbeat_seconds=0.2, lease_seconds=5)
    celery = make_celery(settings)
    rt = WorkerRuntime(settings, load_registry(settings.model_registry), celery)
    rt.start()
    for job in ("long", "queued"):
        rt.call(rt.store.create(NewJob(job, "text-generation", "tiny-gpt2",
                                       {"prompts": ["a"]}, 1)))
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


def test_a_sub_request_canceled_while_queued_never_starts(runtime: WorkerRuntime) -> None:
    decoder = runtime.engines["tiny-gpt2"].scheduling
    started: list[TextItem] = []
    pipeline = runtime.engines["tiny-gpt2"].pipeline
    start = pipeline.start
    pipeline.start = lambda item: started.append(item) or start(item)  # type: ignore[method-assign]
    # Its budget is the model's positions: it holds the one slot for a second or more.
    long = SubRequest(job_id="long", index=0, model="tiny-gpt2",
                      item=TextItem(prompt="a", max_new_tokens=1000))
    queued = SubRequest(job_id="queued", index=0, model="tiny-gpt2",
                        item=TextItem(prompt="b", max_new_tokens=5))
    running = _in_background(runtime, long)
    _until(lambda: decoder.running, "the long sub-request never started")
    waiting = _in_background(runtime, queued)
    _until(lambda: decoder.waiting, "the second sub-request never reached the queue")

    async def cancel() -> int:  # what the cancel listener does when its job is canceled
        return runtime.flights.stop_job("queued", StopReason.CANCELED)

    assert runtime.call(cancel()) == 1
    waiting["thread"].join(5)
    assert waiting["outcome"] == "canceled"
    assert decoder.running and not decoder.waiting  # it left while the slot was still taken
    assert [item.prompt for item in started] == ["a"]
    assert runtime.call(runtime.store.attempts("queued", 0)) == 0  # never charged
    runtime.call(cancel_long(runtime))
    running["thread"].join(10)
    assert running["outcome"] == "canceled"


async def cancel_long(rt: WorkerRuntime) -> int:
    return rt.flights.stop_job("long", StopReason.CANCELED)
