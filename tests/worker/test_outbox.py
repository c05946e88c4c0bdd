"""The worker's live-event outbox (services/worker/outbox.py) on a real Redis: events handed
over from another thread go out in order, gathered into few pipelines; an urgent one goes out
at once, with everything handed over before it."""

import asyncio
import time

import pytest

from services.worker import outbox as outbox_module
from services.worker.outbox import EventOutbox

CHANNEL = "fm:events:outbox-test"


async def _heard(pubsub, seconds: float) -> list[bytes]:
    got = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        msg = await pubsub.get_message(timeout=left)
        if msg is not None:
            got.append(msg["data"])
    return got


class CountingPipelines:
    """The real client, counting the pipelines it opens."""

    def __init__(self, redis) -> None:
        self.redis, self.count = redis, 0

    def pipeline(self, **kwargs):
        self.count += 1
        return self.redis.pipeline(**kwargs)


@pytest.fixture
async def pubsub(aredis):
    ps = aredis.pubsub(ignore_subscribe_messages=True)
    await ps.subscribe(CHANNEL)
    await _heard(ps, 0.05)  # the subscription's confirmation
    yield ps
    await ps.aclose()


async def test_events_from_a_thread_arrive_in_order_in_one_pipeline(
    aredis, pubsub, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(outbox_module, "GATHER_SECONDS", 3600)  # only the flush below sends
    counting = CountingPipelines(aredis)
    box = EventOutbox(counting, asyncio.get_running_loop())
    payloads = [f"event-{i}" for i in range(200)]
    await asyncio.to_thread(lambda: [box.put(CHANNEL, p) for p in payloads])
    await box.flush()
    assert [m.decode() for m in await _heard(pubsub, 0.3)] == payloads
    assert counting.count == 1  # not one round trip per event


async def test_gathered_events_go_out_without_being_asked(aredis, pubsub):
    box = EventOutbox(aredis, asyncio.get_running_loop())
    await asyncio.to_thread(lambda: [box.put(CHANNEL, "a"), box.put(CHANNEL, "b")])
    assert await _heard(pubsub, 1.0) == [b"a", b"b"]  # after GATHER_SECONDS, on its own


async def test_an_urgent_event_goes_out_at_once_with_those_before_it(
    aredis, pubsub, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(outbox_module, "GATHER_SECONDS", 3600)
    box = EventOutbox(aredis, asyncio.get_running_loop())
    await asyncio.to_thread(lambda: [box.put(CHANNEL, "a"), box.put(CHANNEL, "b")])
    assert await _heard(pubsub, 0.3) == []  # gathered, not sent yet
    await asyncio.to_thread(box.put, CHANNEL, "now", True)
    assert await _heard(pubsub, 1.0) == [b"a", b"b", b"now"]
    await asyncio.to_thread(box.put, CHANNEL, "later")
    await box.flush()  # a text sub-request's `flushed()` before its result is stored
    assert await _heard(pubsub, 0.3) == [b"later"]
