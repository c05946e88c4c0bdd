"""The joiner: joins in input order, fails fast, and takes over a dead replica's entries."""

import asyncio

from services.api.joiner import Joiner
from shared import names
from shared.job import JobError
from shared.jobstore import NewJob
from shared.messages import CompletionEntry, SubResult


async def _job(store, total=3):
    await store.create(NewJob("j1", "text-generation", "tiny-gpt2", {"prompts": ["a"] * total},
                              total))


async def _drain(joiner: Joiner) -> None:
    resp = await joiner.redis.xreadgroup(
        names.JOINER_GROUP, joiner.consumer, {names.COMPLETIONS_STREAM: ">"}, count=100
    )
    for _s, entries in resp or []:
        await joiner._handle_batch(entries)


async def test_output_is_assembled_in_input_order(store, aredis, settings, lifecycle):
    await _job(store)
    joiner = Joiner(aredis, lifecycle, settings, "api-1")
    await joiner.ensure_group()
    for index in (2, 0, 1):  # finish out of order
        await store.store_result(
            "j1",
            SubResult(
                index=index,
                output={"text": f"t{index}", "finish_reason": "length", "tokens": 1},
                worker="w",
            ),
        )
        await _drain(joiner)
        rec = await store.get("j1")
        assert rec.done == [2, 0, 1].index(index) + 1
    rec = await store.get("j1")
    assert rec.status == "succeeded"
    assert [o["text"] for o in rec.output] == ["t0", "t1", "t2"]


async def test_first_error_fails_the_job_keeping_finished_outputs(
    store, aredis, settings, lifecycle
):
    await _job(store)
    joiner = Joiner(aredis, lifecycle, settings, "api-1")
    await joiner.ensure_group()
    await store.store_result(
        "j1", SubResult(index=0, output={"text": "ok", "finish_reason": "length", "tokens": 1})
    )
    await store.store_result(
        "j1", SubResult(index=1, error=JobError(code="model_error", message="boom"))
    )
    await _drain(joiner)
    rec = await store.get("j1")
    assert rec.status == "failed"
    assert rec.error.code == "model_error" and "sub-request 1: boom" in rec.error.message
    assert rec.output[0]["text"] == "ok" and rec.output[1:] == [None, None]


async def test_entries_of_a_dead_replica_are_reclaimed(store, aredis, settings, lifecycle):
    await _job(store, total=1)
    dead = Joiner(aredis, lifecycle, settings, "api-dead")
    await dead.ensure_group()
    await store.store_result(
        "j1", SubResult(index=0, output={"text": "x", "finish_reason": "length", "tokens": 1})
    )
    # The dead replica read the entry and never acknowledged it.
    await aredis.xreadgroup(names.JOINER_GROUP, "api-dead", {names.COMPLETIONS_STREAM: ">"})
    assert (await store.get("j1")).status == "queued"
    alive = Joiner(aredis, lifecycle, settings, "api-alive")
    await asyncio.sleep(settings.joiner_claim_idle_seconds * 2)
    assert await alive.reclaim() == 1
    assert (await store.get("j1")).status == "succeeded"
    pending = await aredis.xpending(names.COMPLETIONS_STREAM, names.JOINER_GROUP)
    assert pending["pending"] == 0


async def test_two_joiners_side_by_side_finish_each_job_once(store, aredis, settings, lifecycle):
    from shared.job import JobMeta
    from shared.job_metrics import JOBS_FINISHED

    n_jobs = 20
    # With a `completed` webhook: such a job's final change is also a stream entry.
    meta = JobMeta(webhook="https://hooks.example.com/x")
    for j in range(n_jobs):
        await store.create(NewJob(f"k{j}", "text-generation", "tiny-gpt2", {"prompts": ["a"]}, 2,
                                  meta))
    # Both replicas stay alive: neither may take the other's entries. (The suite's claim idle
    # of 50 ms would let a slow moment of a loaded machine count as a dead replica.)
    alive = settings.model_copy(update={"joiner_claim_idle_seconds": 30.0})
    joiners = [Joiner(aredis, lifecycle, alive, f"api-{i}") for i in range(2)]
    await joiners[0].ensure_group()
    before = JOBS_FINISHED.labels("text-generation", "tiny-gpt2", "succeeded")._value.get()
    tasks = [asyncio.create_task(j.run()) for j in joiners]
    for j in range(n_jobs):
        for index in range(2):
            await store.store_result(
                f"k{j}",
                SubResult(
                    index=index, output={"text": "x", "finish_reason": "length", "tokens": 1}
                ),
            )
    for _ in range(300):
        statuses = [(await store.get(f"k{j}")).status for j in range(n_jobs)]
        handled = sum(j.handled for j in joiners)
        if all(s == "succeeded" for s in statuses) and handled >= 3 * n_jobs:
            break
        await asyncio.sleep(0.02)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert all(s == "succeeded" for s in statuses)
    after = JOBS_FINISHED.labels("text-generation", "tiny-gpt2", "succeeded")._value.get()
    assert after - before == n_jobs
    # Each entry handled once: two results and one `final` per job.
    assert sum(j.handled for j in joiners) == 3 * n_jobs


async def test_completed_webhook_is_enqueued_even_if_the_finisher_died(
    store, aredis, settings, lifecycle
):
    from services.api.webhooks.outbox import due_key, webhook_id
    from shared.job import JobMeta, JobStatus

    meta = JobMeta(webhook="https://hooks.example.com/x")
    await store.create(NewJob("j1", "text-generation", "tiny-gpt2", {"prompts": ["a"]}, 1, meta))
    joiner = Joiner(aredis, lifecycle, settings, "api-2")
    await joiner.ensure_group()
    # A replica finalized the job and died before enqueueing its webhook.
    assert await store.finalize("j1", JobStatus.CANCELED, [None])
    assert await aredis.zcard(due_key("completed")) == 0
    await _drain(joiner)
    assert await aredis.zscore(due_key("completed"), webhook_id("j1", "completed")) is not None


async def test_a_job_without_webhooks_is_joined_from_its_results_alone(
    store, aredis, settings, lifecycle
):
    from shared.job import JobStatus
    from shared.messages import SubRequest, TextItem

    await store.create(NewJob("j1", "text-generation", "tiny-gpt2", {"prompts": ["a"]}, 1))
    joiner = Joiner(aredis, lifecycle, settings, "api-1")
    await joiner.ensure_group()
    sub = SubRequest(job_id="j1", index=0, model="tiny-gpt2",
                     item=TextItem(prompt="a", max_new_tokens=1))
    await store.acquire_lease(sub, "w", 30, 3)
    await store.store_result(
        "j1", SubResult(index=0, output={"text": "x", "finish_reason": "length", "tokens": 1},
                        worker="w"))
    await _drain(joiner)
    assert (await store.get("j1")).status == JobStatus.SUCCEEDED
    # No `started` entry (its event went out as the lease was taken), no `final` entry (no
    # webhook to send): the one result was all there was to join.
    assert joiner.handled == 1 and await aredis.xlen(names.COMPLETIONS_STREAM) == 1


async def test_a_batch_is_acknowledged_with_the_next_read(store, aredis, settings, lifecycle):
    from shared.job import JobStatus

    n_jobs = 10
    for j in range(n_jobs):
        await store.create(NewJob(f"k{j}", "text-generation", "tiny-gpt2", {"prompts": ["a"]}, 1))
    joiner = Joiner(aredis, lifecycle, settings, "api-1")
    await joiner.ensure_group()
    await aredis.config_resetstat()
    task = asyncio.create_task(joiner.run())
    for j in range(n_jobs):
        await store.store_result(f"k{j}", SubResult(
            index=0, output={"text": "x", "finish_reason": "length", "tokens": 1}))
    async with asyncio.timeout(10):
        while (await aredis.xpending(names.COMPLETIONS_STREAM, names.JOINER_GROUP))["pending"]:
            await asyncio.sleep(0.02)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    statuses = [(await store.get(f"k{j}")).status for j in range(n_jobs)]
    assert statuses == [JobStatus.SUCCEEDED] * n_jobs
    stats = await aredis.info("commandstats")
    # Never more acknowledgements than reads: each rides along with the read after its batch.
    acks, reads = stats["cmdstat_xack"]["calls"], stats["cmdstat_xreadgroup"]["calls"]
    assert acks >= 1, "the joined entries were never acknowledged"
    assert acks <= reads, f"{acks} acknowledgements for {reads} reads"


async def test_the_stream_keeps_every_entry_not_yet_joined(store, aredis, settings, lifecycle):
    """Joiners that fall far behind lose nothing: 3,000 completions pile up unread while a
    length cap of 1,000 would have dropped most of them; trimming drops only what was joined."""
    from shared.redis_scripts.loader import source

    assert not any("MAXLEN" in source(s) for s in ("store_result", "finalize", "acquire_lease"))
    joiner = Joiner(aredis, lifecycle, settings, "api-1")
    await joiner.ensure_group()
    jobs = 1500
    for i in range(jobs):
        await store.create(NewJob(f"j{i}", "text-generation", "tiny-gpt2", {"prompts": ["a", "b"]},
                                  2))
    for i in range(jobs):
        for index in (0, 1):
            await store.store_result(f"j{i}", SubResult(
                index=index, output={"text": "t", "finish_reason": "length", "tokens": 1}))
    assert await aredis.xlen(names.COMPLETIONS_STREAM) == 2 * jobs
    assert await joiner.trim() == 0  # nothing read yet: nothing goes
    resp = await aredis.xreadgroup(names.JOINER_GROUP, "api-1", {names.COMPLETIONS_STREAM: ">"},
                                   count=1000)
    entries = resp[0][1]
    await joiner._handle_batch(entries[:600])  # 400 more read but not yet acknowledged
    assert await joiner.trim() == 600
    await joiner._handle_batch(entries[600:])
    while await _read_more(joiner):
        pass
    assert await joiner.trim() == 2 * jobs - 601  # the last one delivered stays, as a marker
    finished = [await store.get(f"j{i}") for i in range(jobs)]
    assert all(rec.status == "succeeded" for rec in finished)


async def _read_more(joiner: Joiner) -> int:
    resp = await joiner.redis.xreadgroup(
        names.JOINER_GROUP, joiner.consumer, {names.COMPLETIONS_STREAM: ">"}, count=1000)
    entries = [e for _s, batch in resp or [] for e in batch]
    await joiner._handle_batch(entries)
    return len(entries)


async def test_different_jobs_are_joined_side_by_side_and_a_jobs_own_in_order(
    store, aredis, settings, lifecycle
):
    for job, total in (("j1", 2), ("j2", 1)):
        await store.create(NewJob(job, "text-generation", "tiny-gpt2", {"prompts": ["a"] * total},
                                  total))
    joiner = Joiner(aredis, lifecycle, settings, "api-1")
    await joiner.ensure_group()
    for job, index in (("j1", 0), ("j1", 1), ("j2", 0)):
        await store.store_result(job, SubResult(
            index=index, output={"text": "t", "finish_reason": "length", "tokens": 1}))
    events = []
    j2_started = asyncio.Event()
    handle = joiner.handle

    async def watched(fields):
        entry = CompletionEntry.from_fields(fields)
        events.append(("start", entry.job, entry.index))
        if entry.job == "j2":
            j2_started.set()
        else:  # j1's entries come first in the stream: they finish only if j2's runs beside
            await asyncio.wait_for(j2_started.wait(), 5)
        await handle(fields)
        events.append(("end", entry.job, entry.index))

    joiner.handle = watched
    await _drain(joiner)
    assert [e for e in events if e[1] == "j1"] == [
        ("start", "j1", 0), ("end", "j1", 0), ("start", "j1", 1), ("end", "j1", 1)]
    assert ("end", "j2", 0) in events
    assert (await store.get("j1")).status == "succeeded"
    assert (await store.get("j2")).status == "succeeded"
