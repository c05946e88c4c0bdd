"""kombu's Redis transport as Fibermill configures it: the same queues and messages, its ack
emulation kept in the consumer's memory (a delivered message is held until acknowledged, and
goes back to its queue when rejected with requeue or when its channel closes), and nothing
written to Redis for it: a message costs its push and its pop."""

import base64
import json
from typing import Any

import pytest
import redis
from kombu import Queue

from shared import celery_config
from shared.celery_config import make_celery
from shared.job import BATCH_PRIORITY, MAX_PRIORITY
from shared.messages import SubRequest, TextItem
from shared.names import queue_for
from shared.queue_depth import batch_list, priority_lists
from shared.sending import _send
from shared.settings import Settings

SUB = SubRequest(job_id="j1", index=0, model="tiny-gpt2",
                 item=TextItem(prompt="a", max_new_tokens=1))


@pytest.fixture
def celery(redis_url):
    app = make_celery(Settings(redis_url=redis_url))
    yield app
    app.close()


def _queued(r: redis.Redis, key: str) -> list[SubRequest]:
    out = []
    for raw in r.lrange(key, 0, -1):
        args, _kwargs, _embed = json.loads(base64.b64decode(json.loads(raw)["body"]))
        out.append(SubRequest.from_task_arg(args[0]))
    return out


def _calls(r: redis.Redis) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items()
            if k not in ("cmdstat_info", "cmdstat_config|resetstat")}


def test_celery_uses_the_transport(celery):
    with celery.connection_for_write() as conn:
        assert isinstance(conn.transport, celery_config.Transport)
        channel = conn.default_channel
        assert isinstance(channel.qos, celery_config.QoS)
        with channel.conn_or_acquire() as a, channel.conn_or_acquire() as b:
            assert a is b  # one client, not one per command


def _take(channel) -> Any:
    message = Queue(queue_for("tiny-gpt2"), channel=channel, max_priority=9).get(no_ack=False)
    assert message is not None
    return message


def test_a_message_is_held_until_acked_with_no_command_of_its_own(celery, sredis):
    r = sredis
    _send(celery, [SUB], 5)
    key = priority_lists("tiny-gpt2")[5]
    assert r.llen(key) == 1
    with celery.connection_for_read() as conn:
        channel = conn.channel()
        r.config_resetstat()
        message = _take(channel)
        assert message.delivery_info["routing_key"] == queue_for("tiny-gpt2")
        assert r.llen(key) == 0
        assert channel.qos.get(message.delivery_tag) is message  # held, counted for prefetch
        message.ack()
        channel.close()
        assert r.llen(key) == 0  # acknowledged: not handed back at close
    calls = _calls(r)
    # The pops that looked for it (a priority list each up to its own), this test's LLENs and
    # the connection's handshake: nothing written.
    assert set(calls) <= {"rpop", "llen", "hello", "ping", "client|setinfo"}, calls
    assert not r.exists("unacked") and not r.exists("unacked_index")


def test_the_prefetch_limit_counts_held_messages(celery, sredis):
    _send(celery, [SUB, SUB], 5)
    with celery.connection_for_read() as conn:
        channel = conn.channel()
        channel.basic_qos(0, 1, False)
        message = _take(channel)
        assert not channel.qos.can_consume()
        message.ack()
        assert channel.qos.can_consume()
        channel.close()


@pytest.mark.parametrize("how", ["rejected with requeue", "unacknowledged at channel close"])
def test_a_held_message_goes_back_to_its_queue_once(celery, sredis, how):
    r = sredis
    _send(celery, [SUB], 5)
    key = priority_lists("tiny-gpt2")[5]
    with celery.connection_for_read() as conn:
        channel = conn.channel()
        message = _take(channel)
        assert r.llen(key) == 0
        if how == "rejected with requeue":
            message.reject(requeue=True)
            assert _queued(r, key) == [SUB]
        channel.close()  # as a worker's warm shutdown does
    assert _queued(r, key) == [SUB]  # a rejected message is not handed back again at close


def test_a_dead_consumers_message_is_left_for_the_orphan_sweep(celery, sredis):
    """A consumer that dies holding a message leaves no copy of it in Redis: its sub-request is
    outstanding with no lease and in no queue, which the orphan sweep sends again
    (tests/api/test_janitor.py)."""
    r = sredis
    _send(celery, [SUB], 5)
    key = priority_lists("tiny-gpt2")[5]
    with celery.connection_for_read() as conn:
        dead = conn.channel()
        dead.qos.restore_at_shutdown = False  # it dies: nothing handed back
        _take(dead)
        dead.close()
    with celery.connection_for_read() as conn:
        live = conn.channel()
        live.qos.restore_visible(interval=1)  # what a live consumer's poller calls
        live.close()
    assert r.llen(key) == 0 and not r.exists("unacked")


def _sub(model: str, job_id: str) -> SubRequest:
    return SubRequest(job_id=job_id, index=0, model=model,
                      item=TextItem(prompt="a", max_new_tokens=1))


def test_a_consumer_takes_batch_work_only_while_no_interactive_message_waits(celery, sredis):
    """As a worker consumes (BRPOP over its queues): batch lines queued first, then an
    interactive message of the lowest priority on another of the worker's models."""
    _send(celery, [_sub("tiny-gpt2", f"b{i}") for i in range(3)], BATCH_PRIORITY)
    _send(celery, [_sub("digits", "i1")], MAX_PRIORITY)
    assert sredis.llen(batch_list("tiny-gpt2")) == 3
    got: list[str] = []

    def take(body, message) -> None:
        got.append(SubRequest.from_task_arg(body[0][0]).job_id)
        message.ack()

    with celery.connection_for_read() as conn:
        queues = [Queue(queue_for(m)) for m in ("tiny-gpt2", "digits")]
        with conn.Consumer(queues, callbacks=[take], accept=["json"]) as consumer:
            consumer.qos(prefetch_count=1)
            while len(got) < 4:
                conn.drain_events(timeout=5)
    assert got == ["i1", "b0", "b1", "b2"]


def test_a_rejected_batch_message_goes_back_to_the_batch_list(celery, sredis):
    _send(celery, [SUB], BATCH_PRIORITY)
    with celery.connection_for_read() as conn:
        channel = conn.channel()
        _take(channel).reject(requeue=True)
        channel.close()
    assert _queued(sredis, batch_list("tiny-gpt2")) == [SUB]
    assert sredis.llen(priority_lists("tiny-gpt2")[MAX_PRIORITY]) == 0
