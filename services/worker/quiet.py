"""A worker's start prints what its operator needs (what it loaded, what it serves, that it is
ready), not the libraries' advice and progress bars."""

import logging
import os
import warnings

from celery.exceptions import SecurityWarning


def quiet_libraries() -> None:
    """Before transformers and diffusers are imported: both read their verbosity then. An
    operator's own setting of these variables wins."""
    # Advice meant for notebooks (such as "torchvision is not installed, falling back to the
    # PIL image processor", for processors the served models never use).
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
    # Weight-loading progress bars: a log is not a terminal.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # The container image runs workers as an unprivileged user (services/worker/Dockerfile); as
    # root, on a developer's machine, Celery's warning is about a choice already made, and
    # its refusal case (pickle accepted) cannot arise: tasks are JSON only.
    warnings.filterwarnings("ignore", category=SecurityWarning,
                            message=r"You're running the worker with superuser privileges")
    # A line per task received and per task succeeded is chatter at thousands of tasks a
    # second (and CPU on the hot path); failures are still logged, at ERROR.
    for name in ("celery.worker.strategy", "celery.app.trace"):
        logging.getLogger(name).setLevel(logging.WARNING)


def quiet_diffusers() -> None:
    """diffusers' "Loading pipeline components" bar has no environment switch."""
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.disable_progress_bar()
