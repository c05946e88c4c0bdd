"""kombu's Redis transport as Fibermill configures it: the same queues, messages and ack
emulation (a delivered message is kept until acknowledged, and goes back to its queue if its
consumer is lost) in fewer commands: no MULTI/EXEC, no new client per command."""

import base64
import json
import time

import pytest
import redis
from kombu import Queue

from shared import celery_config
from shared.celery_config import make_celery
from shared.messages import SubRequest, TextItem
from shared.names import queue_for
from shared.queue_depth import priority_lists
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


def test_a_message_is_kept_until_acked_then_gone_without_multi(celery, sredis):
    r = sredis
    _send(celery, [SUB], 5)
    key = priority_lists("tiny-gpt2")[5]
    assert r.llen(key) == 1
    with celery.connection_for_read() as conn:
        channel = conn.channel()
        queue = Queue(queue_for("tiny-gpt2"), channel=channel, max_priority=9)
        r.config_resetstat()
        message = queue.get(no_ack=False)
        assert message is not None and message.delivery_info["routing_key"] == queue.name
        assert r.llen(key) == 0
        tag = message.delivery_tag
        assert r.hexists("unacked", tag) and r.zscore("unacked_index", tag) is not None
        message.ack()
        assert not r.hexists("unacked", tag) and r.zscore("unacked_index", tag) is None
        calls = _calls(r)
        assert "multi" not in calls and "exec" not in calls
        assert calls.get("zadd") == calls.get("hset") == calls.get("zrem") == 1
        channel.close()


def test_an_unacked_message_goes_back_to_its_queue_when_its_consumer_is_lost(celery, sredis):
    r = sredis
    _send(celery, [SUB], 5)
    key = priority_lists("tiny-gpt2")[5]
    with celery.connection_for_read() as conn:
        channel = conn.channel()
        message = Queue(queue_for("tiny-gpt2"), channel=channel, max_priority=9).get(
            no_ack=False)
        assert message is not None and r.llen(key) == 0
        channel.close()  # as a worker's warm shutdown does; a dead one's after the timeout
    assert _queued(r, key) == [SUB] and r.hlen("unacked") == 0


def test_a_dead_consumers_message_is_restored_after_the_visibility_timeout(redis_url, sredis):
    r = sredis
    app = make_celery(Settings(redis_url=redis_url, visibility_timeout_seconds=2,
                               subrequest_time_limit_seconds=1))
    _send(app, [SUB], 5)
    key = priority_lists("tiny-gpt2")[5]
    with app.connection_for_read() as conn:
        dead = conn.channel()
        dead.qos.restore_at_shutdown = False  # it dies: nothing handed back
        assert Queue(queue_for("tiny-gpt2"), channel=dead, max_priority=9).get(no_ack=False)
        dead.close()
    assert r.llen(key) == 0 and r.hlen("unacked") == 1
    time.sleep(2.2)
    with app.connection_for_read() as conn:
        conn.channel().qos.restore_visible(interval=1)  # what any live consumer does
    assert _queued(r, key) == [SUB] and r.hlen("unacked") == 0
    app.close()
