"""The job store on a real Redis: atomic transitions, write-once results, leases."""

import asyncio

import pytest

from shared import names
from shared.errors import JobNotFound
from shared.job import JobStatus
from shared.jobstore import JobStore
from shared.messages import GeneratedText, SubRequest, SubResult, TextItem

FINALS = [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED]


def _text(text: str) -> GeneratedText:
    return GeneratedText(text=text, finish_reason="length", tokens=1)


async def _job(store: JobStore, job_id: str = "j1", total: int = 3):
    return await store.create(job_id, "text-generation", "tiny-gpt2", {"prompts": ["a"]}, total)


def _sub(job_id: str = "j1", index: int = 0) -> SubRequest:
    return SubRequest(job_id=job_id, index=index, model="tiny-gpt2",
                      item=TextItem(prompt="a", max_new_tokens=2))


async def test_create_and_read_back(store):
    await _job(store)
    rec = await store.get("j1")
    assert (rec.status, rec.total, rec.done, rec.input) == ("queued", 3, 0, {"prompts": ["a"]})
    with pytest.raises(JobNotFound):
        await store.get("nope")


async def test_the_first_lease_starts_the_job_once(store):
    await _job(store)
    await store.acquire_lease(_sub(index=0), "w1", 30, 3)
    started = (await store.get("j1")).started_at
    await store.acquire_lease(_sub(index=1), "w2", 30, 3)
    rec = await store.get("j1")
    assert rec.status == JobStatus.RUNNING and rec.started_at == started is not None


@pytest.mark.parametrize("final", FINALS)
async def test_final_state_is_never_left(store, final):
    await _job(store)
    assert await store.finalize("j1", final, [None, None, None])
    # Every script that changes a job refuses a final one.
    assert (await store.acquire_lease(_sub(), "w1", 30, 3)).outcome == "final"
    assert await store.store_result("j1", SubResult(index=0, output=None)) == -2
    for to in FINALS:
        assert not await store.finalize("j1", to, [{"text": "x"}])
    rec = await store.get("j1")
    assert rec.status == final and rec.output == [None, None, None]


async def test_concurrent_finalize_has_one_winner(store):
    await _job(store)
    wins = await asyncio.gather(*[
        store.finalize("j1", FINALS[i % 3], [None]) for i in range(30)
    ])
    assert sum(wins) == 1


async def test_finished_job_gets_ttl(store, aredis):
    await _job(store)
    await store.store_result("j1", SubResult(index=0, output=_text("x")))
    await store.finalize("j1", JobStatus.SUCCEEDED, [{"text": "x"}])
    for key in (names.job_key("j1"), names.results_key("j1")):
        assert 0 < await aredis.ttl(key) <= 3600


async def test_concurrent_duplicate_results_are_written_once(store, aredis):
    await _job(store, total=4)
    writes = []
    for index in range(4):
        for copy in range(10):  # ten deliveries of each index, with different payloads
            r = SubResult(index=index, output=_text(f"{index}-{copy}"), worker=f"w{copy}")
            writes.append(store.store_result("j1", r, blob=f"png{index}-{copy}".encode()))
    outcomes = await asyncio.gather(*writes)
    assert outcomes.count(1) == 4 and outcomes.count(0) == 36
    results = await store.results("j1")
    assert sorted(results) == [0, 1, 2, 3]
    for index, r in results.items():
        copy = r.worker[1:]
        assert r.output == _text(f"{index}-{copy}")
        assert await store.blob("j1", index) == f"png{index}-{copy}".encode()
    assert (await store.get("j1")).done == 4
    assert await aredis.xlen(names.COMPLETIONS_STREAM) == 4  # one completion per index


async def test_result_refused_once_job_is_final(store):
    await _job(store)
    await store.finalize("j1", JobStatus.CANCELED, [None, None, None])
    assert await store.store_result("j1", SubResult(index=0, output=_text("late"))) == -2
    assert await store.results("j1") == {}


async def test_lease_lifecycle(store):
    await _job(store)
    sub = _sub()
    grant = await store.acquire_lease(sub, "w1", lease_seconds=30, max_attempts=3)
    assert (grant.outcome, grant.attempt) == ("acquired", 1)
    assert (await store.get("j1")).status == JobStatus.RUNNING
    # another worker cannot take a live lease
    assert (await store.acquire_lease(sub, "w2", 30, 3)).outcome == "busy"
    assert await store.renew_leases([sub.member], "w1", 30) == 1
    assert await store.renew_leases([sub.member], "w2", 30) == 0
    await store.store_result("j1", SubResult(index=0, output=_text("x"), worker="w1"))
    assert (await store.acquire_lease(sub, "w2", 30, 3)).outcome == "done"


async def test_expired_lease_is_claimed_once_and_counts_attempts(store):
    await _job(store)
    sub = _sub()
    for attempt in (1, 2, 3):
        grant = await store.acquire_lease(sub, f"w{attempt}", lease_seconds=-1, max_attempts=3)
        assert (grant.outcome, grant.attempt) == ("acquired", attempt)
        claims = await asyncio.gather(*[store.claim_expired_leases() for _ in range(5)])
        assert sum(len(c) for c in claims) == 1
    assert await store.attempts("j1", 0) == 3
    assert (await store.acquire_lease(sub, "w4", 30, 3)).outcome == "exhausted"


async def test_lease_refused_for_final_job(store):
    await _job(store)
    await store.finalize("j1", JobStatus.CANCELED, [None] * 3)
    assert (await store.acquire_lease(_sub(), "w1", 30, 3)).outcome == "final"
    assert (await store.acquire_lease(_sub("zz"), "w1", 30, 3)).outcome == "gone"


async def test_stale_dispatch_is_claimed(store):
    await _job(store)
    assert await store.claim_stale_dispatches(older_than=3600) == []
    assert await store.claim_stale_dispatches(older_than=-1) == ["j1"]
    await _job(store, "j2")
    await store.mark_dispatched("j2")
    assert await store.claim_stale_dispatches(older_than=-1) == []
