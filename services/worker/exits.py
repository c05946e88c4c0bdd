"""The one way a worker process ends itself, with a named exit code for each reason.

Every reason is a process that can no longer be trusted to serve: the launcher (or Kubernetes)
starts a clean one. `os._exit` because a thread stuck in a model cannot be joined, and Celery's
own shutdown would wait for it.
"""

import logging
import os
from enum import IntEnum
from typing import NoReturn

log = logging.getLogger(__name__)


class ExitReason(IntEnum):
    MODELS_FAILED_TO_LOAD = 3
    # EX_SOFTWARE: a sub-request ignored its stop past its time limit; its failure is stored.
    STOP_IGNORED_PAST_TIME_LIMIT = 70
    # EX_OSERR: the device failed for good (a sticky CUDA error); what was held went back.
    DEVICE_LOST = 71
    # EX_TEMPFAIL: a sub-request ignored its drain stop; its lease is expired for the janitor.
    STOP_IGNORED_IN_DRAIN = 75


def exit_worker(reason: ExitReason) -> NoReturn:
    log.critical("worker exiting: %s (exit code %d)", reason.name.lower().replace("_", " "),
                 reason.value)
    for handler in logging.getLogger().handlers:  # os._exit skips the flush at exit
        handler.flush()
    os._exit(reason.value)
