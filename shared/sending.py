"""Sending sub-requests to their model's Celery queue: by the API at submit and by the janitor,
and by a draining worker handing work back.

At submit the API does not publish through kombu: `task_messages` builds the very messages
kombu's Redis transport would push (Celery's task protocol 2, built by Celery's own
`as_task_v2`), and the job store pushes them onto the queue in the same atomic step that stores
the job (shared/jobstore.py `create`, shared/redis_scripts/scripts/create_job.lua). That saves
the broker round trip and the thread it needs, and a job can no longer be stored without its
sub-requests.
"""

import asyncio
import base64
import json
import os
import socket
import time
import uuid
from typing import Any

from celery import Celery
from kombu.utils.json import dumps

from shared.job import BATCH_PRIORITY, DEFAULT_PRIORITY
from shared.jobstore import Enqueue
from shared.messages import SubRequest
from shared.names import RUN_SUBREQUEST_TASK, queue_for
from shared.queue_depth import priority_lists


async def send_subrequests(
    celery: Celery, subs: list[SubRequest], priority: int = DEFAULT_PRIORITY
) -> None:
    """Enqueue on each model's queue; 0 is the highest priority, BATCH_PRIORITY (a batch's
    lines only) the lowest."""
    _check_priority(priority)
    if subs:
        # kombu publishes synchronously; keep it off the event loop.
        await asyncio.to_thread(_send, celery, subs, priority)


def _send(celery: Celery, subs: list[SubRequest], priority: int) -> None:
    with celery.producer_or_acquire() as producer:
        for sub in subs:
            celery.send_task(
                RUN_SUBREQUEST_TASK,
                args=_task_args(sub),
                queue=queue_for(sub.model),
                producer=producer,
                priority=priority,
                headers=_trace_headers(sub),
            )


def _task_args(sub: SubRequest) -> list[dict[str, Any]]:
    args = sub.task_args()
    # A traced sub-request says when it was sent: its worker's span of the wait starts there.
    if sub.traceparent is not None:
        args[0]["sent_at"] = time.time()
    return args


def _trace_headers(sub: SubRequest) -> dict[str, str] | None:
    """The job's trace in the message's headers too, as Celery-aware tools (Celery's own
    instrumentation, where someone adds it) look for it; the worker's spans read it from the
    sub-request, which every sender rebuilds or passes on."""
    return {"traceparent": sub.traceparent} if sub.traceparent is not None else None


def _check_priority(priority: int) -> None:
    if not 0 <= priority <= BATCH_PRIORITY:
        # kombu would clamp it silently into another priority list.
        raise ValueError(f"priority must be 0..{BATCH_PRIORITY}, not {priority}")


class TaskMessages:
    """Celery messages for `run_subrequest`, exactly as `celery.send_task` through kombu's Redis
    transport would push them (tests/shared/test_sending.py compares the two), built without
    touching the broker."""

    def __init__(self, celery: Celery) -> None:
        self.celery = celery
        self.origin = f"gen{os.getpid()}@{socket.gethostname()}"
        self.reply_to = str(uuid.uuid4())  # as Celery's per-app oid: no result is ever sent

    def build(self, subs: list[SubRequest], priority: int = DEFAULT_PRIORITY) -> Enqueue:
        """The messages of one job's sub-requests (one model, one priority), and the list
        kombu keeps for that model and priority."""
        _check_priority(priority)
        models = {s.model for s in subs}
        if len(models) != 1:
            raise ValueError(f"one job's sub-requests share one model, not {sorted(models)}")
        queue = queue_for(models.pop())
        return Enqueue(priority_lists(subs[0].model)[priority],
                       [self._message(s, queue, priority) for s in subs])

    def _message(self, sub: SubRequest, queue: str, priority: int) -> bytes:
        task_id = str(uuid.uuid4())
        args = _task_args(sub)
        headers, properties, body, _ = self.celery.amqp.as_task_v2(
            task_id, RUN_SUBREQUEST_TASK, args=args, kwargs={}, reply_to=self.reply_to,
            origin=self.origin, ignore_result=None,  # as send_task leaves it: the app's setting
            # for logs only; Celery's saferepr of the whole input costs more than the rest
            argsrepr=f"[<sub-request {sub.member}>]", kwargsrepr="{}",
        )
        extra = _trace_headers(sub)
        if extra:
            headers.update(extra)  # as send_task's `headers` does
        properties.update(
            delivery_mode=2,  # persistent, as the default exchange's
            delivery_info={"exchange": "", "routing_key": queue},
            priority=priority,
            body_encoding="base64",
            delivery_tag=str(uuid.uuid4()),
        )
        return dumps({
            "body": base64.b64encode(dumps(body).encode()).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": headers,
            "properties": properties,
        }).encode()


def message_member(raw: bytes) -> str | None:
    """The sub-request (`job:index`) a queued message carries, or None for a message that is
    not one of ours."""
    try:
        body = json.loads(base64.b64decode(json.loads(raw)["body"]))
        sub = body[0][0]
        return f"{sub['job_id']}:{sub['index']}"
    except (ValueError, KeyError, IndexError, TypeError):
        return None
