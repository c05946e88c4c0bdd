"""One worker process: its device, its loaded models, and the event loop its work runs on.

Celery's thread pool hands each sub-request to `WorkerRuntime.handle`, which runs it on the
runtime's own asyncio loop. Each model has an engine (its pipeline's model code, scheduled by a
batcher or a continuous decoder) whose model runs on a single-thread device executor, so a
model object is never run by two threads at once however many sub-requests are in flight.

The runtime only assembles its parts, all built in `__init__` and none importing it back:

    handler (leases, run, store) -> engines, flights, drainer, progress
    heartbeat (announce, renew, time limits) -> flights, cancel listener
    cancel listener (stop what a final job still runs) -> flights
    drainer (SIGTERM deadline, hand-backs) -> flights, Celery
"""

import asyncio
import contextlib
import logging
import socket
import threading
import time

import torch
import uvloop
from celery import Celery

from services.worker import metrics
from services.worker.cancellation import CancelListener
from services.worker.drain import Drainer
from services.worker.engine.engine import Engine
from services.worker.flights import Flights
from services.worker.handler import Handler
from services.worker.heartbeat import Heartbeat
from services.worker.identity import WorkerIdentity
from services.worker.outbox import EventOutbox
from services.worker.outputs import OutputWriter
from services.worker.pipelines.dtypes import allow_tf32
from services.worker.pipelines.factory import build_pipeline
from services.worker.progress import ProgressPublisher
from shared.blobstore.factory import open_store
from shared.jobstore import JobStore
from shared.messages import Outcome, SubRequest
from shared.names import queue_for
from shared.redis_client import connect
from shared.registry import ModelRegistry, ModelSpec
from shared.settings import Settings
from shared.workers import withdraw

log = logging.getLogger(__name__)


def pick_device(settings: Settings) -> torch.device:
    # The launcher pins one GPU per process through CUDA_VISIBLE_DEVICES, so it is cuda:0.
    if settings.device == "cuda" or (not settings.device and torch.cuda.is_available()):
        return torch.device("cuda", 0)
    return torch.device("cpu")


class WorkerRuntime:
    def __init__(self, settings: Settings, registry: ModelRegistry, celery: Celery) -> None:
        self.settings = settings
        served = settings.served_models or list(registry.models)
        self.specs: dict[str, ModelSpec] = {m: registry.get(m) for m in served}
        self.device = pick_device(settings)
        allow_tf32(self.device)
        name = settings.worker_name or f"{socket.gethostname()}-{self.device.type}"
        self.identity = WorkerIdentity(name, str(self.device))
        self.engines: dict[str, Engine] = {}  # filled by start(): loading takes a while
        self.flights = Flights()
        # uvloop: the runtime loop runs every sub-request's Redis calls and hand-offs; the
        # stock loop's per-tick Python work cost about as much CPU as the calls themselves.
        self.loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="runtime-loop",
                                        daemon=True)
        # Connections are opened on first use, on the runtime loop.
        self.redis = connect(settings)
        self.store = JobStore(self.redis, settings.finished_job_ttl_seconds)
        self.drainer = Drainer(settings, self.id, self.store, self.flights, celery)
        # Used on the runtime loop only (an S3 client belongs to the loop that opened it).
        self.blobs = open_store(settings)
        self.handler = Handler(settings, self.id, self.store, self.engines, self.flights,
                               self.drainer, ProgressPublisher(EventOutbox(self.redis, self.loop)),
                               OutputWriter(self.blobs, settings.blob_outage_seconds))
        self.cancels = CancelListener(self.redis, self.flights)
        self.heartbeat = Heartbeat(settings, self.identity, list(self.specs), self.redis,
                                   self.store, self.flights, self.cancels)
        self._background: list[asyncio.Task] = []

    @property
    def id(self) -> str:
        return self.identity.id

    @property
    def queues(self) -> list[str]:
        return [queue_for(m) for m in self.specs]

    def load_models(self) -> None:
        for name, spec in self.specs.items():
            t0 = time.perf_counter()
            pipeline = build_pipeline(spec, self.device)
            pipeline.setup()
            self.engines[name] = Engine(pipeline, batching=self.settings.batching,
                                        on_start=self.handler.started)
            seconds = time.perf_counter() - t0
            metrics.MODEL_LOAD_SECONDS.labels(name).set(seconds)
            log.info("loaded %s (%s) on %s in %.2fs", name, spec.kind, self.device, seconds)

    def start(self) -> None:
        """Load the models, then start the loop, the heartbeat and the cancel listener."""
        self.load_models()
        self._thread.start()
        self.call(self._start_async())

    async def _start_async(self) -> None:
        self._background.append(asyncio.create_task(self.heartbeat.run(), name="heartbeat"))
        self._background.append(asyncio.create_task(self.cancels.run(), name="cancels"))

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
        for t in self._background:
            t.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        try:
            await withdraw(self.redis, self.id)
        except Exception:  # Redis may already be gone; the heartbeat key expires anyway
            log.warning("could not withdraw worker %s from Redis", self.id)
        await self.redis.aclose()
        await self.blobs.close()

    def begin_drain(self) -> None:
        """SIGTERM (docs/architecture.md, "Drain (SIGTERM)"). Called from a signal handler in
        the main thread, so it only sets a flag and wakes the loop."""
        if self.drainer.draining or not self._thread.is_alive():
            return
        self.drainer.draining = True
        deadline = time.monotonic() + self.settings.drain_seconds
        with contextlib.suppress(RuntimeError):  # a closed loop has nothing left to drain
            self.loop.call_soon_threadsafe(self._watch_drain, deadline)

    def _watch_drain(self, deadline: float) -> None:
        if self.flights:
            log.warning("draining: finishing %d sub-request(s), handing back what is left in "
                        "%.0fs", len(self.flights), self.settings.drain_seconds)
        else:
            log.info("draining: nothing in flight")
        self._background.append(asyncio.create_task(self.drainer.watch(deadline), name="drain"))

    def call(self, coro):
        """Run a coroutine on the runtime loop from another thread and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def handle(self, sub: SubRequest) -> Outcome:
        return self.call(self.handler.handle(sub))
