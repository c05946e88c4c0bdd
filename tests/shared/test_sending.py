"""Sub-request messages built without kombu are the messages kombu publishes, and the job store
pushes them onto the right priority list in the step that stores their job."""

import base64
import json

import pytest

from shared import names
from shared.celery_config import make_celery
from shared.job import BATCH_PRIORITY, JobMeta
from shared.jobstore import Enqueue, JobStore, NewJob
from shared.messages import SubRequest, TextItem
from shared.queue_depth import priority_lists
from shared.sending import TaskMessages, send_subrequests
from shared.settings import Settings

# Differ per message (uuids) or per process, or are ours to choose (argsrepr: logs only).
VARYING_HEADERS = {"id", "root_id", "origin", "argsrepr"}
VARYING_PROPERTIES = {"correlation_id", "reply_to", "delivery_tag"}


def _subs(job_id: str = "j1", n: int = 2) -> list[SubRequest]:
    return [SubRequest(job_id=job_id, index=i, model="tiny-gpt2",
                       item=TextItem(prompt=f"p{i}", max_new_tokens=3, seed=7 + i))
            for i in range(n)]


@pytest.fixture
def celery(redis_url):
    app = make_celery(Settings(redis_url=redis_url))
    yield app
    app.close()


def _comparable(raw: bytes) -> dict:
    message = json.loads(raw)
    assert message["headers"]["root_id"] == message["headers"]["id"]
    assert message["properties"]["correlation_id"] == message["headers"]["id"]
    for key in VARYING_HEADERS:
        message["headers"].pop(key)
    for key in VARYING_PROPERTIES:
        message["properties"].pop(key)
    message["body"] = json.loads(base64.b64decode(message["body"]))
    return message


@pytest.mark.parametrize("priority", [0, 5, 9])
async def test_built_messages_are_what_celery_publishes(celery, aredis, priority):
    subs = _subs()
    await send_subrequests(celery, subs, priority)
    key = priority_lists("tiny-gpt2")[priority]
    published = [_comparable(r) for r in reversed(await aredis.lrange(key, 0, -1))]
    built = TaskMessages(celery).build(subs, priority)
    assert built.queue == key
    assert [_comparable(m) for m in built.messages] == published
    ids = {json.loads(m)["headers"]["id"] for m in built.messages}
    tags = {json.loads(m)["properties"]["delivery_tag"] for m in built.messages}
    assert len(ids) == len(tags) == 2  # every message its own task id and delivery tag
    # A worker reads its argument back as the sub-request sent.
    args, kwargs, _embed = published[0]["body"]
    assert SubRequest.from_task_arg(args[0]) == subs[0] and kwargs == {}


def test_one_job_one_model_one_valid_priority(celery):
    messages = TaskMessages(celery)
    with pytest.raises(ValueError):
        messages.build(_subs(), BATCH_PRIORITY + 1)
    mixed = [*_subs(), SubRequest(job_id="j1", index=2, model="digits",
                                  item=TextItem(prompt="x", max_new_tokens=1))]
    with pytest.raises(ValueError):
        messages.build(mixed)


async def test_a_job_is_stored_with_its_messages_in_one_step(store: JobStore, aredis, celery):
    subs = _subs("j1", 3)
    enqueue = TaskMessages(celery).build(subs, 2)
    meta = JobMeta(priority=2, webhook="https://example.com/h", deadline_seconds=30)
    await store.create(NewJob("j1", "text-generation", "tiny-gpt2", {"prompts": ["a"] * 3}, 3,
                              meta), enqueue=enqueue)
    # On the queue in order (kombu pops from the right), not marked as being dispatched.
    assert await aredis.lrange(enqueue.queue, 0, -1) == enqueue.messages[::-1]
    assert await aredis.zscore(names.DISPATCHING, "j1") is None
    assert await aredis.zcard(names.backlog_key("tiny-gpt2")) == 3
    assert await aredis.zscore(names.DEADLINES, "j1") is not None
    assert await aredis.hget(names.job_key("j1"), "hooks") == b"completed"
    rec = await store.get("j1")
    assert (rec.status, rec.total, rec.done, rec.meta.priority) == ("queued", 3, 0, 2)
    # Without messages the caller sends them itself: marked for the janitor until it has.
    await store.create(NewJob("j2", "text-generation", "tiny-gpt2", {"prompts": ["a"]}, 1))
    assert await aredis.zscore(names.DISPATCHING, "j2") is not None
    assert await aredis.llen(enqueue.queue) == 3


async def test_many_messages_go_in_chunks(store: JobStore, aredis):
    messages = [f"m{i}".encode() for i in range(700)]  # past Lua's unpack() chunk
    await store.create(NewJob("big", "text-generation", "tiny-gpt2", {"prompts": ["a"]}, 700),
                       enqueue=Enqueue("fibermill.tiny-gpt2", messages))
    assert await aredis.lrange("fibermill.tiny-gpt2", 0, -1) == messages[::-1]
    assert await aredis.zcard(names.backlog_key("tiny-gpt2")) == 700
