"""One worker process: its device, its loaded models, and the event loop its work runs on.

Celery's thread pool hands each sub-request to `WorkerRuntime.handle`, which runs it on the
runtime's own asyncio loop. Each model has an engine (batcher + operator pipeline) whose model
runs on a single-thread device executor, so a model object is never run by two threads at once
however many sub-requests are in flight.
"""

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time

import redis.asyncio as aioredis
import torch

from services.worker import metrics
from services.worker.engine.engine import Engine
from services.worker.pipelines.factory import build_pipeline
from shared.jobstore import JobStore
from shared.registry import ModelRegistry, ModelSpec
from shared.settings import Settings
from shared.subrequest import SubRequest

log = logging.getLogger(__name__)


def pick_device(settings: Settings) -> torch.device:
    # The launcher pins one GPU per process through CUDA_VISIBLE_DEVICES, so it is cuda:0.
    if settings.device == "cuda" or (not settings.device and torch.cuda.is_available()):
        return torch.device("cuda", 0)
    return torch.device("cpu")


class InFlight:
    """A sub-request this process holds: for lease renewal, cancellation and time limits."""

    def __init__(self, sub: SubRequest, deadline: float) -> None:
        self.sub = sub
        self.started = time.time()
        self.deadline = deadline
        self.stop = threading.Event()
        self.stop_reason: str | None = None  # "canceled", "time_limit" or "drain"
        self.steps = 0  # step boundaries passed so far (denoise or decode steps)
        self.stop_requested_at_step: int | None = None

    def request_stop(self, reason: str) -> None:
        """Ask the pipeline to stop at its next denoise or decode step."""
        if not self.stop.is_set():
            self.stop_reason = reason
            self.stop_requested_at_step = self.steps
            self.stop.set()


class WorkerRuntime:
    def __init__(self, settings: Settings, registry: ModelRegistry) -> None:
        self.settings = settings
        self.registry = registry
        served = settings.served_models or list(registry.models)
        self.specs: dict[str, ModelSpec] = {m: registry.get(m) for m in served}
        self.device = pick_device(settings)
        self.name = settings.worker_name or f"{socket.gethostname()}-{self.device.type}"
        self.id = f"{self.name}/{os.getpid()}"
        self.started_at = time.time()
        self.engines: dict[str, Engine] = {}
        self.in_flight: dict[str, InFlight] = {}
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="runtime-loop", daemon=True
        )
        self.redis: aioredis.Redis | None = None
        self.store: JobStore | None = None
        self._background: list[asyncio.Task] = []
        self.celery = None  # the worker's Celery app (set by celery_app): drain hand-backs
        self.draining = False  # SIGTERM seen: finishing what it holds (services/worker/drain.py)
        self.drain_expired = False  # past FIBERMILL_DRAIN_SECONDS: handing back what is left

    @property
    def queues(self) -> list[str]:
        from shared.names import queue_for

        return [queue_for(m) for m in self.specs]

    def load_models(self) -> None:
        for name, spec in self.specs.items():
            t0 = time.perf_counter()
            pipeline = build_pipeline(spec, self.device)
            pipeline.setup()
            self.engines[name] = Engine(pipeline, batching=self.settings.batching)
            metrics.MODEL_LOAD_SECONDS.labels(name).set(time.perf_counter() - t0)
            log.info(
                "loaded %s (%s) on %s in %.2fs",
                name,
                spec.kind,
                self.device,
                time.perf_counter() - t0,
            )

    def start(self) -> None:
        """Load the models, then start the loop, the heartbeat and lease renewal."""
        self.load_models()
        self._thread.start()
        self.call(self._start_async())

    async def _start_async(self) -> None:
        from services.worker.cancellation import listen_for_cancels
        from services.worker.heartbeat import heartbeat_loop

        self.redis = aioredis.Redis.from_url(self.settings.redis_url)
        self.store = JobStore(self.redis, self.settings.finished_job_ttl_seconds)
        self._background.append(asyncio.create_task(heartbeat_loop(self)))
        self._background.append(asyncio.create_task(listen_for_cancels(self)))

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self.call(self._stop_async())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()
        for engine in self.engines.values():
            engine.pipeline.device_executor.shutdown(wait=False, cancel_futures=True)

    async def _stop_async(self) -> None:
        from shared.workers import withdraw

        for t in self._background:
            t.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self.redis is not None:
            try:
                await withdraw(self.redis, self.id)
            except Exception:  # Redis may already be gone; the heartbeat key expires anyway
                log.warning("could not withdraw worker %s from Redis", self.id)
            await self.redis.aclose()

    def begin_drain(self) -> None:
        """SIGTERM (Celery's warm shutdown): arm the drain deadline. Called from a signal
        handler in the main thread, so it only sets flags and wakes the loop."""
        if self.draining or not self._thread.is_alive():
            return
        self.draining = True
        deadline = time.monotonic() + self.settings.drain_seconds
        with contextlib.suppress(RuntimeError):  # a closed loop has nothing left to drain
            self.loop.call_soon_threadsafe(self._start_drain_watch, deadline)

    def _start_drain_watch(self, deadline: float) -> None:
        from services.worker.drain import drain_watch

        log.warning("draining: finishing %d sub-request(s), handing back what is left in %.0fs",
                    len(self.in_flight), self.settings.drain_seconds)
        self._background.append(asyncio.create_task(drain_watch(self, deadline)))

    def call(self, coro):
        """Run a coroutine on the runtime loop from another thread and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop_job(self, job_id: str, reason: str = "canceled") -> int:
        """Stop every sub-request of `job_id` this process is running; returns how many."""
        flights = [f for f in self.in_flight.values() if f.sub.job_id == job_id]
        for f in flights:
            f.request_stop(reason)
        return len(flights)

    def handle(self, sub: SubRequest) -> str:
        from services.worker.handler import handle

        return self.call(handle(self, sub))
