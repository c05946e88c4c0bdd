"""The event hub: one pub/sub connection per API process for every `Prefer: wait` and event
stream, waking many waiters from it; the job store stays the truth."""

import asyncio
import dataclasses
import time

import pytest
import redis.asyncio as aioredis

from services.api.events import EventHub, job_events, wait_final
from shared import names
from shared.job import JobMeta, JobStatus
from shared.jobstore import NewJob
from shared.messages import (
    FinishReason,
    OutputData,
    OutputEvent,
    StepData,
    StepEvent,
    SubRequest,
    SubResult,
    TextItem,
)


@pytest.fixture
async def hub(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    hub = EventHub(client)
    task = asyncio.create_task(hub.run())
    async with asyncio.timeout(5):
        await hub.connected.wait()
    yield hub
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await client.aclose()


async def _job(store, job_id: str, total: int = 1, meta: JobMeta | None = None):
    return await store.create(NewJob(job_id, "text-generation", "tiny-gpt2",
                                     {"prompts": ["a"] * total}, total, meta))


async def _pubsub_clients(aredis) -> int:
    return sum(1 for c in await aredis.client_list() if int(c.get("sub", 0) or 0) > 0
               or int(c.get("psub", 0) or 0) > 0)


async def test_many_waiters_share_one_connection_and_each_gets_its_job(hub, store, aredis):
    recs = [await _job(store, f"j{i}") for i in range(50)]
    before = int((await aredis.info("stats"))["total_connections_received"])
    waits = [asyncio.create_task(wait_final(hub, store, r.id, 10, r)) for r in recs]
    await asyncio.sleep(0.1)
    assert hub.waiters == 50
    assert await _pubsub_clients(aredis) == 1  # the hub's, whatever the number of waiters
    t0 = time.monotonic()
    for r in recs[::-1]:
        await store.finalize(r.id, JobStatus.CANCELED, [None])
    done = await asyncio.gather(*waits)
    assert time.monotonic() - t0 < 2  # woken by the final channel, not by the 1 s poll
    assert [d.id for d in done] == [r.id for r in recs]
    assert all(d.status == JobStatus.CANCELED for d in done)
    assert hub.waiters == 0
    # No connection per wait: at most the shared client's pool grew a little.
    after = int((await aredis.info("stats"))["total_connections_received"])
    assert after - before <= 5


async def test_a_waiter_costs_no_command_until_its_job_is_final(hub, store, aredis):
    rec = await _job(store, "j1")
    await aredis.config_resetstat()
    wait = asyncio.create_task(wait_final(hub, store, "j1", 10, rec))
    await asyncio.sleep(0.3)
    stats = await aredis.info("commandstats")
    assert set(stats) <= {"cmdstat_config|resetstat", "cmdstat_info"}
    await store.finalize("j1", JobStatus.CANCELED, [None])
    assert (await wait).status == JobStatus.CANCELED


async def test_a_job_final_just_before_the_wait_wakes_it_at_once(hub, store):
    rec = await _job(store, "j1")
    await store.finalize("j1", JobStatus.CANCELED, [None])
    await asyncio.sleep(0.1)  # the hub hears it before anyone waits
    t0 = time.monotonic()
    got = await wait_final(hub, store, "j1", 10, rec)  # rec is the job as it was: queued
    assert got.status == JobStatus.CANCELED and time.monotonic() - t0 < 0.5


async def test_a_wait_ends_with_the_job_as_it_is_after_its_time(hub, store):
    rec = await _job(store, "j1")
    t0 = time.monotonic()
    got = await wait_final(hub, store, "j1", 1.2, rec)
    assert got.status == JobStatus.QUEUED and 1.1 < time.monotonic() - t0 < 3


async def test_the_store_is_the_truth_when_a_message_is_lost(hub, store, aredis):
    rec = await _job(store, "j1")
    wait = asyncio.create_task(wait_final(hub, store, "j1", 10, rec))
    await asyncio.sleep(0.1)
    # Final without its message (as if it were lost): the next poll of the store finds it.
    await aredis.hset(names.job_key("j1"), mapping={"status": "failed", "output": "[null]",
                                                   "completed_at": repr(time.time())})
    t0 = time.monotonic()
    assert (await wait).status == JobStatus.FAILED
    assert time.monotonic() - t0 < 2


async def test_a_record_finished_here_is_handed_over_without_a_read(hub, store, aredis):
    rec = await _job(store, "j1")
    wait = asyncio.create_task(wait_final(hub, store, "j1", 10, rec))
    await asyncio.sleep(0.1)
    await aredis.config_resetstat()
    # As Lifecycle does once FINALIZE made the job final here (whose message on the final
    # channel, left out here, may come before or after: the waiter takes the record).
    final = dataclasses.replace(rec, status=JobStatus.CANCELED, output=[None],
                                completed_at=time.time())
    hub.finished_here(final)
    assert await wait is final
    assert "cmdstat_hgetall" not in await aredis.info("commandstats")


async def test_the_hub_reconnects_and_wakes_its_waiters(hub, store, aredis):
    rec = await _job(store, "j1")
    wait = asyncio.create_task(wait_final(hub, store, "j1", 20, rec))
    await asyncio.sleep(0.1)
    await aredis.client_kill_filter(_type="pubsub")
    await asyncio.sleep(1.5)  # reconnected (or reconnecting)
    async with asyncio.timeout(5):
        while await _pubsub_clients(aredis) < 1:
            await asyncio.sleep(0.05)
    await store.finalize("j1", JobStatus.CANCELED, [None])
    assert (await asyncio.wait_for(wait, 5)).status == JobStatus.CANCELED


async def test_event_streams_share_the_job_channel_and_leave_it(hub, store, aredis):
    await _job(store, "j1", total=2)
    channel = names.events_channel("j1")
    streams = [job_events(hub, store, "j1", "") for _ in range(2)]
    firsts = [await s.__anext__() for s in streams]  # subscribed, then read
    assert [f[0] for f in firsts] == ["status", "status"]
    assert firsts[0][1]["status"] == "queued"
    assert (await aredis.pubsub_numsub(channel)) == [(channel.encode(), 1)]

    step = StepEvent(data=StepData(index=0, step=1, steps=4))
    await aredis.publish(channel, step.encode())
    for s in streams:
        assert await s.__anext__() == ("step", {"index": 0, "step": 1, "steps": 4})

    sub = SubRequest(job_id="j1", index=0, model="tiny-gpt2",
                     item=TextItem(prompt="a", max_new_tokens=1))
    await store.acquire_lease(sub, "w", 30, 3)  # publishes the `running` status event
    for s in streams:
        event, data = await s.__anext__()
        assert (event, data["status"]) == ("status", "running")
    await store.store_result("j1", SubResult(index=0, output={
        "text": "x", "finish_reason": "length", "tokens": 1}, worker="w"))
    await aredis.publish(channel, b'{"event": "progress", "data": {"done": 1, "total": 2}}')
    for s in streams:
        assert await s.__anext__() == ("progress", {"done": 1, "total": 2})
    await store.finalize("j1", JobStatus.CANCELED, [None, None])  # heard on the final channel
    for s in streams:
        event, data = await s.__anext__()
        assert (event, data["status"]) == ("status", "canceled")
        with pytest.raises(StopAsyncIteration):
            await s.__anext__()
    async with asyncio.timeout(5):
        while (await aredis.pubsub_numsub(channel)) != [(channel.encode(), 0)]:
            await asyncio.sleep(0.02)
    assert await _pubsub_clients(aredis) == 1


async def test_an_event_stream_yields_text_as_it_is_decoded(hub, store, aredis):
    await _job(store, "j1")
    stream = job_events(hub, store, "j1", "")
    assert (await stream.__anext__())[0] == "status"
    channel = names.events_channel("j1")
    deltas = [OutputData(index=0, text="Hel", tokens=2),
              OutputData(index=0, text="lo", offset=3, tokens=3,
                         finish_reason=FinishReason.LENGTH, prompt_tokens=4)]
    for data in deltas:
        await aredis.publish(channel, OutputEvent(data=data).encode())
    assert [await stream.__anext__() for _ in deltas] == [
        ("output", {"index": 0, "text": "Hel", "offset": 0, "tokens": 2,
                    "finish_reason": None, "prompt_tokens": None}),
        ("output", {"index": 0, "text": "lo", "offset": 3, "tokens": 3,
                    "finish_reason": "length", "prompt_tokens": 4}),
    ]
    await store.finalize("j1", JobStatus.CANCELED, [None])
    assert (await stream.__anext__())[1]["status"] == "canceled"
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()


def test_prefer_wait_opens_no_connection_of_its_own(settings_env, redis_url):
    import redis as sync_redis
    from fastapi.testclient import TestClient

    from services.api.app import create_app

    body = {"task": "text-generation", "model": "tiny-gpt2", "input": {"prompts": ["a"]}}
    r = sync_redis.Redis.from_url(redis_url)
    with TestClient(create_app()) as client:
        client.post("/v1/jobs", json=body)  # the app's pool is warm

        def received() -> int:
            return int(r.info("stats")["total_connections_received"])

        before = received()
        for _ in range(2):
            resp = client.post("/v1/jobs", json=body, headers={"Prefer": "wait=1"})
            assert resp.status_code == 202 and resp.headers["Preference-Applied"] == "wait=1"
        assert received() - before <= 1  # (this test's own INFO connection at most)
