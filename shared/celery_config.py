"""The Celery configuration both sides use: the API to send sub-requests, workers to run them."""

from celery import Celery

from shared.settings import Settings

# One Redis list per priority: kombu names them `queue` (0), `queue:1` ... `queue:9` and BRPOPs
# them in this order, so 0 is served first, matching JobOptions.priority (0 highest).
PRIORITY_STEPS = list(range(10))
PRIORITY_SEP = ":"


def make_celery(settings: Settings, name: str = "fibermill") -> Celery:
    app = Celery(name, broker=settings.redis_url)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        result_backend=None,
        task_ignore_result=True,
        # A sub-request is acknowledged only after it ran; if the worker process is lost the
        # message goes back to the queue instead of vanishing.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            # Redis redelivers unacknowledged messages after this long; it must exceed the
            # longest legitimate run or a running sub-request would be handed out twice.
            "visibility_timeout": settings.visibility_timeout_seconds,
            "priority_steps": PRIORITY_STEPS,
            "sep": PRIORITY_SEP,
            # Message priority comes from the BRPOP key order alone. The order between queues
            # only breaks ties at equal priority; "priority" would always prefer the first
            # model in a worker's -Q list and starve the others, round robin takes turns.
            "queue_order_strategy": "round_robin",
        },
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        task_send_sent_event=False,
        worker_enable_remote_control=False,
    )
    return app
