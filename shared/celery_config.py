"""The Celery configuration both sides use: the API to send sub-requests, workers to run them."""

from contextlib import contextmanager

from celery import Celery
from kombu.transport import redis as kombu_redis

from shared.settings import Settings

# One Redis list per priority: kombu names them `queue` (0), `queue:1` ... `queue:9` and BRPOPs
# them in this order, so 0 is served first, matching JobOptions.priority (0 highest).
PRIORITY_STEPS = list(range(10))
PRIORITY_SEP = ":"


class QoS(kombu_redis.QoS):
    """kombu's ack emulation (a delivered message is kept in `unacked` until acknowledged, and
    restored to its queue if its consumer is lost), its two bookkeeping steps each sent as a
    plain pipeline rather than MULTI/EXEC: 2 commands per step instead of 4. Each step's two
    commands still travel together and are run back to back; the one reader of both keys,
    `restore_visible`, only looks at entries older than the visibility timeout."""

    @contextmanager
    def pipe_or_acquire(self, pipe=None, client=None):
        if pipe:
            yield pipe
        else:
            with self.channel.conn_or_acquire(client) as client:
                yield client.pipeline(transaction=False)


class Channel(kombu_redis.Channel):
    """kombu's Redis channel, but its short commands (the ack emulation's, two per message)
    reuse one client of the channel's pool instead of building a `redis.Redis` each time,
    which costs more than the commands themselves."""

    QoS = QoS
    _short_client = None

    @contextmanager
    def conn_or_acquire(self, client=None):
        if client:
            yield client
            return
        pool = self.pool  # a new one after a reconnect: then a new client
        short = self._short_client
        if short is None or short.connection_pool is not pool:
            short = self._short_client = self._create_client()
        yield short


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with the channel above (`broker_transport`): the same keys, the
    same messages and the same guarantees, in 6 commands per message instead of 10."""

    Channel = Channel


TRANSPORT = f"{__name__}:Transport"


def make_celery(settings: Settings, name: str = "fibermill") -> Celery:
    app = Celery(name, broker=settings.redis_url)
    app.conf.update(
        broker_transport=TRANSPORT,
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
