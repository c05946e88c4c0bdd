"""The worker's Celery app: one task that hands a sub-request to this process's runtime.

Run with the thread pool (`-P threads`): several sub-requests can be in flight in one process
(the engine batches them), and nothing forks after CUDA is initialised. How SIGTERM drains
this process is told in docs/architecture.md ("Drain (SIGTERM)"); the signals below are where
Celery hands over to the runtime.
"""

import logging
import time
from pathlib import Path

from celery import signals
from celery.exceptions import Reject
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from services.worker.exits import ExitReason, exit_worker
from services.worker.metrics_server import serve_metrics
from services.worker.quiet import quiet_libraries
from services.worker.runtime import WorkerRuntime
from shared import tracing
from shared.celery_config import make_celery
from shared.errors import ModelNotLoadable
from shared.logs import configure as configure_logs
from shared.messages import SubRequest
from shared.names import RUN_SUBREQUEST_TASK
from shared.registry import load_registry
from shared.settings import get_settings

log = logging.getLogger(__name__)

quiet_libraries()  # before the models load, which imports transformers and diffusers
app = make_celery(get_settings(), name="fibermill-worker")
_runtime: WorkerRuntime | None = None


def _configure_logs(level: str | int | None) -> None:
    """The worker's lines look like every other process's, named for its slot."""
    settings = get_settings()
    configure_logs(f"worker-{settings.device or 'cpu'}{settings.device_index}", level=level)


@signals.celeryd_init.connect
def _early_logs(options: dict | None = None, **_) -> None:
    # The worker starting: before worker_init, whose model loading logs what it loaded, and
    # which Celery sends before it sets logging up (setup_logging below).
    _configure_logs((options or {}).get("loglevel"))


@signals.setup_logging.connect
def _logs(loglevel: str | int | None = None, **_) -> None:
    # Connected, this replaces Celery's own logging set-up (its format, its stdout redirect).
    _configure_logs(loglevel)


@signals.worker_init.connect
def _load(**_) -> None:
    global _runtime
    settings = get_settings()
    # No Celery instrumentation: its task span would cover what the lease span does, and no
    # publish span exists to join it to (docs/architecture.md, "Tracing").
    tracing.setup("fibermill-worker")
    try:
        _runtime = WorkerRuntime(settings, load_registry(settings.model_registry), app)
        _runtime.start()
    except ModelNotLoadable as exc:
        log.critical("worker cannot start: %s", exc)
        exit_worker(ExitReason.MODELS_FAILED_TO_LOAD)
    except Exception:
        # Celery would log this and go on consuming with no models; a worker that cannot
        # load what it serves must exit instead (the launcher or Kubernetes restarts it).
        log.critical("worker failed to load its models", exc_info=True)
        exit_worker(ExitReason.MODELS_FAILED_TO_LOAD)
    if settings.ready_file:  # the launcher restarts a worker that was ready without a backoff
        Path(settings.ready_file).touch()
    serve_metrics(settings.worker_metrics_port + settings.device_index)


@signals.worker_shutting_down.connect
def _drain(**_) -> None:
    # Sent from Celery's signal handler: arms the drain deadline.
    if _runtime is not None:
        _runtime.begin_drain()


@signals.worker_shutdown.connect
def _stop(**_) -> None:
    # Sent once the thread pool has joined: nothing runs any more.
    if _runtime is not None:
        _runtime.stop()


# Before a message that could not be recorded is handed back: a Redis that is away for a moment
# should not see the same message bounce at full speed.
REQUEUE_PAUSE_SECONDS = 1.0


@app.task(name=RUN_SUBREQUEST_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)
def run_subrequest(self, payload: dict) -> str:
    sub = SubRequest.from_task_arg(payload)
    if _runtime is None:  # set up in the worker process's init signal, before any task
        raise RuntimeError("the worker runtime has not started")
    try:
        return _runtime.handle(sub).value
    except (RedisConnectionError, RedisTimeoutError) as exc:
        # Nothing could be recorded (no lease, or no result): acknowledging would lose the
        # sub-request, so the message goes back to its queue for another try.
        log.warning("could not record %s (%s); handing its message back", sub.member, exc)
        time.sleep(REQUEUE_PAUSE_SECONDS)
        raise Reject(exc, requeue=True) from exc
