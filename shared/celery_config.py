"""The Celery configuration both sides use: the API to send sub-requests, workers to run them."""

from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import redis
from celery import Celery
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

from shared.job import BATCH_PRIORITY
from shared.settings import Settings

# One Redis list per priority: kombu names them `queue` (0), `queue:1` ... `queue:10` and BRPOPs
# them in this order, so 0 is served first, matching JobOptions.priority (0 highest). Step 10
# (BATCH_PRIORITY) holds batch lines only: a worker's BRPOP names every interactive list of
# every queue it consumes before any batch list, so it takes batch work only when no
# interactive sub-request waits, with its prefetch (one per thread) unchanged.
PRIORITY_STEPS = list(range(BATCH_PRIORITY + 1))
PRIORITY_SEP = ":"


class QoS(virtual.QoS):
    """kombu's ack emulation kept in this process only: a delivered message is held in memory
    until acknowledged (which is what the prefetch limit counts), and goes back to its queue
    when rejected with requeue or when the channel closes unacknowledged (a warm shutdown).

    kombu's Redis QoS also writes each delivered message to an `unacked` hash and index and
    removes it on the ack: four commands and two round trips per message, so that a consumer
    that dies holding a message has it restored once the visibility timeout (an hour) passes.
    Fibermill recovers that case itself, and sooner: the sub-request is outstanding in its
    model's backlog with no lease and in no queue, which the orphan sweep
    (services/api/orphans.py) finds and sends again after `FIBERMILL_LOST_SUBREQUEST_SECONDS`."""

    def restore_visible(self, *args, **kwargs) -> None:
        """Nothing of this transport's is kept in Redis to restore."""


class Channel(kombu_redis.Channel):
    """kombu's Redis channel with the QoS above. Its short commands (a message handed back)
    reuse one client of the channel's pool instead of building a `redis.Redis` each time,
    which costs more than the commands themselves."""

    ack_emulation = False  # kombu's Redis-side emulation off; the QoS above is its own
    # kombu clamps a message's priority to 9 when it puts one back (a rejected message, a
    # draining worker's); the batch step must go back to the batch list.
    max_priority = BATCH_PRIORITY
    _short_client = None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # kombu's attribute is inferred as its Redis QoS only, though kombu itself puts a plain
        # virtual.QoS there when ack emulation is off, as it is here.
        self.QoS = QoS  # type: ignore[assignment]

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
    """kombu's Redis transport with the channel above (`broker_transport`): the same keys and
    messages, in 2 commands per message (LPUSH, BRPOP) instead of kombu's 6."""

    Channel = Channel


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """The channel above on the primary the sentinels name: kombu's Sentinel channel opens
    its connections through redis-py's Sentinel pool, which follows a failover (a demoted
    primary's READONLY and unblocked BRPOPs reconnect to the new one)."""


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel


TRANSPORT = f"{__name__}:Transport"
SENTINEL_TRANSPORT = f"{__name__}:SentinelTransport"


def broker(settings: Settings) -> tuple[str, str, dict[str, Any]]:
    """The broker URL, transport and transport options of `settings`' Redis: its URL, or with
    Sentinel each sentinel as `sentinel://` (the data nodes' password and database from
    FIBERMILL_REDIS_URL) and the primary's name."""
    if not settings.sentinel_addresses:
        return settings.redis_url, TRANSPORT, {}
    node = redis.connection.parse_url(settings.redis_url)
    auth = f":{quote(node['password'], safe='')}@" if node.get("password") else ""
    db = node.get("db", 0)
    url = ";".join(f"sentinel://{auth}{_host(h)}:{p}/{db}" for h, p in settings.sentinel_addresses)
    password = settings.redis_sentinel_password
    return url, SENTINEL_TRANSPORT, {
        "master_name": settings.redis_sentinel_master,
        "sentinel_kwargs": {"password": password.get_secret_value() if password else None},
    }


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def make_celery(settings: Settings, name: str = "fibermill") -> Celery:
    url, transport, sentinel_options = broker(settings)
    app = Celery(name, broker=url)
    app.conf.update(
        broker_transport=transport,
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        result_backend=None,
        task_ignore_result=True,
        # A message is acknowledged only after its sub-request ran: until then it counts
        # against the prefetch limit (a worker takes no more than it runs), and a warm
        # shutdown hands it back. A lost worker's messages are Fibermill's to recover
        # (leases, the orphan sweep), not the broker's: see QoS.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "priority_steps": PRIORITY_STEPS,
            "sep": PRIORITY_SEP,
            # Message priority comes from the BRPOP key order alone. The order between queues
            # only breaks ties at equal priority; "priority" would always prefer the first
            # model in a worker's -Q list and starve the others, round robin takes turns.
            "queue_order_strategy": "round_robin",
            **sentinel_options,
        },
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        task_send_sent_event=False,
        worker_enable_remote_control=False,
    )
    return app
