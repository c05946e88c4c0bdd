"""The worker's Celery app: one task that hands a sub-request to this process's runtime.

Run with the thread pool (`-P threads`): several sub-requests can be in flight in one process
(the engine batches them), and nothing forks after CUDA is initialised.

Shutdown (SIGTERM, warm): Celery stops consuming, then waits for the running tasks (the
thread pool's join) and only then sends `worker_shutdown`, which stops the runtime; messages
taken but not acknowledged go back to the queue when the channel closes. `worker_shutting_down`
(sent from the signal handler) arms the drain deadline (services/worker/drain.py).
"""

import logging
import os

from celery import signals

from services.worker.runtime import WorkerRuntime
from shared.celery_config import make_celery
from shared.names import RUN_SUBREQUEST_TASK
from shared.registry import load_registry
from shared.settings import get_settings
from shared.subrequest import SubRequest

log = logging.getLogger(__name__)

app = make_celery(get_settings(), name="fibermill-worker")
_runtime: WorkerRuntime | None = None


@signals.worker_init.connect
def _load(**_) -> None:
    global _runtime
    settings = get_settings()
    try:
        _runtime = WorkerRuntime(settings, load_registry(settings.model_registry))
        _runtime.celery = app  # hands sub-requests back to their queue when draining
        _runtime.start()
    except Exception:
        # Celery would log this and go on consuming with no models; a worker that cannot
        # load what it serves must exit instead (the launcher or Kubernetes restarts it).
        log.critical("worker failed to load its models", exc_info=True)
        os._exit(3)
    from services.worker.metrics_server import serve_metrics

    serve_metrics(settings.worker_metrics_port + settings.device_index)


@signals.worker_shutting_down.connect
def _drain(**_) -> None:
    if _runtime is not None:
        _runtime.begin_drain()


@signals.worker_shutdown.connect
def _stop(**_) -> None:
    if _runtime is not None:
        _runtime.stop()


@app.task(name=RUN_SUBREQUEST_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)
def run_subrequest(self, payload: dict) -> str:
    sub = SubRequest.model_validate(payload)
    return _runtime.handle(sub)
