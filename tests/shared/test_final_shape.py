"""Every path that makes a job final goes through one Lua function (fragments/finish_job.lua):
the job's record, its TTLs, its deadline, its `final` stream entry and its announcement come out
the same whichever path ended it."""

import asyncio
from datetime import UTC, datetime

import pytest

from shared import names
from shared.job import JobMeta, JobStatus, WebhookDelivery
from shared.jobstore import Finished, JobStore, NewJob
from shared.messages import GeneratedText, JobError, SubRequest, SubResult, TextItem

OUTPUT = {"text": "x", "finish_reason": "length", "tokens": 1, "worker": "w1"}
META = JobMeta(webhook="https://example.com/h", deadline_seconds=600)
PATHS = ["finalize_with_record", "finalize_reading_the_record", "finalize_failed",
         "store_last_result"]


async def _finish(store: JobStore, path: str) -> None:
    """Run job j1 (one sub-request, leased and charged by w1) to its end along `path`."""
    result = SubResult(index=0, output=GeneratedText(text="x", finish_reason="length",
                                                     tokens=1), worker="w1")
    if path == "store_last_result":
        assert isinstance(await store.store_last_result("j1", result, OUTPUT, "tiny-gpt2"),
                          Finished)
        return
    assert await store.store_result("j1", result, "tiny-gpt2") == 1
    rec = await store.get("j1")
    if path == "finalize_with_record":
        assert await store.finalize("j1", JobStatus.SUCCEEDED, [OUTPUT], rec=rec,
                                    all_results=True)
    elif path == "finalize_reading_the_record":
        assert await store.finalize("j1", JobStatus.SUCCEEDED, [OUTPUT])
    else:
        error = JobError(code="internal", message="sub-request 0: boom")
        assert await store.finalize("j1", JobStatus.FAILED, [None], error, rec=rec,
                                    all_results=True)


async def _final_shape(store: JobStore, aredis, pubsub) -> dict:
    job = await aredis.hgetall(names.job_key("j1"))
    entries = await aredis.xrange(names.COMPLETIONS_STREAM)
    heard = []
    deadline = asyncio.get_running_loop().time() + 0.3
    while (left := deadline - asyncio.get_running_loop().time()) > 0:
        msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=left)
        if msg is not None:
            heard.append((msg["channel"], msg["data"]))
    return {
        # Fields left empty (an owner given up in the final write) hold nothing.
        "fields": sorted(k.decode() for k, v in job.items() if v and k != b"error"),
        "completed_at": float(job[b"completed_at"]) > float(job[b"created_at"]),
        "done": job[b"done"],
        "record_ttl": 0 < await aredis.ttl(names.job_key("j1")) <= store.finished_ttl,
        "webhooks_ttl": 0 < await aredis.ttl(names.webhooks_key("j1")) <= store.finished_ttl,
        # Gone, or on its way out: nothing of what ran it outlives the record.
        "results_ttl": await aredis.ttl(names.results_key("j1")) != -1,
        "deadline": await aredis.zscore(names.DEADLINES, "j1"),
        "lease": await aredis.zscore(names.LEASES, "j1:0"),
        "backlog": await aredis.zscore(names.backlog_key("tiny-gpt2"), "j1:0"),
        "final_entries": [f[b"job"] for _id, f in entries if f[b"kind"] == b"final"],
        "final_channel": [d for c, d in heard if c == names.FINAL_CHANNEL.encode()],
    }


async def _shape_after(path: str, store: JobStore, aredis) -> dict:
    await aredis.flushdb()
    pubsub = aredis.pubsub()
    await pubsub.subscribe(names.FINAL_CHANNEL)
    try:
        await store.create(NewJob("j1", "text-generation", "tiny-gpt2", {"prompts": ["a"]}, 1,
                                  META))
        # A delivery made while it ran, with no TTL yet: it is kept as long as the record.
        delivery = WebhookDelivery(webhook_id="msg_j1_start", event="start", attempt=1,
                                   at=datetime.now(UTC))
        await aredis.rpush(names.webhooks_key("j1"), delivery.model_dump_json())
        sub = SubRequest(job_id="j1", index=0, model="tiny-gpt2",
                         item=TextItem(prompt="a", max_new_tokens=1))
        assert (await store.acquire_lease(sub, "w1", 30, 3)).outcome == "acquired"
        assert await store.charge_attempts([sub.member], "w1") == 1
        await _finish(store, path)
        return await _final_shape(store, aredis, pubsub)
    finally:
        await pubsub.aclose()


@pytest.mark.parametrize("path", PATHS[1:])
async def test_every_path_leaves_the_same_final_state(store, aredis, path):
    expected = await _shape_after(PATHS[0], store, aredis)
    assert expected["fields"] == sorted([
        "attempts:0", "completed_at", "created_at", "done", "fin", "hooks", "input", "meta",
        "model", "output", "started_at", "status", "task", "total",
        "leased:0", "ran:0"])  # the timeline's (shared/timeline.py)
    assert expected["final_entries"] == [b"j1"] and expected["final_channel"] == [b"j1"]
    assert expected["deadline"] is expected["lease"] is expected["backlog"] is None
    assert expected["record_ttl"] and expected["webhooks_ttl"] and expected["results_ttl"]
    assert await _shape_after(path, store, aredis) == expected


async def test_the_error_is_written_with_the_final_status_and_only_then(store, aredis):
    await _shape_after("finalize_failed", store, aredis)
    rec = await store.get("j1")
    assert rec.status == JobStatus.FAILED and rec.error is not None
    await _shape_after("store_last_result", store, aredis)
    assert await aredis.hget(names.job_key("j1"), "error") is None
