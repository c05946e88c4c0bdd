"""The per-model backlog (fm:backlog:{model}, fibermill_subrequests_backlog): a job's
sub-requests join it when the job is stored and leave it, exactly once each, when their result
is stored or when the job becomes final (succeeded, failed, canceled, past its deadline)."""

import asyncio

import pytest

from shared import names
from shared.job import JobError, JobMeta, JobStatus
from shared.jobstore import JobStore, NewJob
from shared.messages import GeneratedText, SubResult
from tests.conftest import backlog

MODEL = "tiny-gpt2"


def _text(text: str) -> GeneratedText:
    return GeneratedText(text=text, finish_reason="length", tokens=1)


async def _job(store: JobStore, job_id: str = "j1", total: int = 3, model: str = MODEL,
               meta: JobMeta | None = None):
    return await store.create(NewJob(job_id, "text-generation", model, {"prompts": ["a"]}, total,
                                     meta))


def _ok(index: int, worker: str = "w1") -> SubResult:
    return SubResult(index=index, output=_text("x"), worker=worker)


def _err(index: int) -> SubResult:
    return SubResult(index=index, worker="w1", error=JobError(code="model_error", message="boom"))


async def _members(aredis, model: str = MODEL) -> set[str]:
    return {m.decode() for m in await aredis.zrange(names.backlog_key(model), 0, -1)}


async def test_a_stored_job_puts_its_sub_requests_in_its_models_backlog(store, aredis):
    await _job(store, "j1", 3)
    await _job(store, "j2", 2, model="pydoc-gpt2")
    assert await backlog(store.redis, MODEL) == 3
    assert await _members(aredis) == {"j1:0", "j1:1", "j1:2"}
    assert await backlog(store.redis, "pydoc-gpt2") == 2
    assert await backlog(store.redis, "digits") == 0


async def test_each_stored_result_leaves_once_and_success_ends_at_zero(store):
    await _job(store, "j1", 3)
    assert await store.store_result("j1", _ok(0)) == 1
    assert await backlog(store.redis, MODEL) == 2
    assert await store.store_result("j1", _ok(0, worker="w2")) == 0  # a duplicate delivery
    assert await backlog(store.redis, MODEL) == 2
    await store.store_result("j1", _ok(1))
    await store.store_result("j1", _ok(2))
    assert await backlog(store.redis, MODEL) == 0
    assert await store.finalize("j1", JobStatus.SUCCEEDED, [{"text": "x"}] * 3)
    assert await backlog(store.redis, MODEL) == 0


@pytest.mark.parametrize("status", [JobStatus.FAILED, JobStatus.CANCELED])
async def test_a_final_job_takes_all_its_outstanding_sub_requests_out(store, aredis, status):
    await _job(store, "j1", 4)
    await _job(store, "other", 2)
    await store.store_result("j1", _ok(0))
    if status == JobStatus.FAILED:
        await store.store_result("j1", _err(1))  # fail fast: 2 and 3 never report
    assert await backlog(store.redis, MODEL) == 2 + (2 if status == JobStatus.FAILED else 3)
    assert await store.finalize("j1", status, [None] * 4)
    assert await _members(aredis) == {"other:0", "other:1"}  # another job is left alone
    # A sub-request still running when the job ended reports late: nothing comes back.
    assert await store.store_result("j1", _ok(3)) == -2
    assert await backlog(store.redis, MODEL) == 2


async def test_deadline_expiry_empties_the_backlog(store):
    """What the janitor does with a job past its deadline (Lifecycle.expire: tests/api)."""
    await _job(store, "j1", 2, meta=JobMeta(deadline_seconds=0.01))
    await asyncio.sleep(0.05)
    assert await store.claim_due_deadlines() == ["j1"]
    error = JobError(code="deadline_exceeded", message="late")
    assert await store.finalize("j1", JobStatus.FAILED, [None, None], error)
    assert await backlog(store.redis, MODEL) == 0


async def test_big_jobs_leave_in_full(store):
    """FINALIZE removes members in chunks (Lua's unpack has a stack limit)."""
    await _job(store, "big", 1000)
    assert await backlog(store.redis, MODEL) == 1000
    assert await store.finalize("big", JobStatus.CANCELED, [None] * 1000)
    assert await backlog(store.redis, MODEL) == 0


async def test_racing_results_duplicates_and_cancel_never_leave_a_member_behind(store):
    for j in range(20):
        await _job(store, f"j{j}", 4)
    writes = []
    for j in range(20):
        for index in range(4):
            for copy in range(2):  # every sub-result delivered twice
                writes.append(store.store_result(f"j{j}", _ok(index, worker=f"w{copy}")))
        if j % 2:
            writes.append(store.finalize(f"j{j}", JobStatus.CANCELED, [None] * 4))
    lanes = asyncio.Semaphore(16)  # interleaved, within the client's connection pool

    async def run(write):
        async with lanes:
            return await write

    await asyncio.gather(*(run(w) for w in writes))
    assert await backlog(store.redis, MODEL) == 0


async def test_a_finished_job_expiring_or_gone_leaves_nothing(store, aredis):
    await _job(store, "j1", 2)
    await store.finalize("j1", JobStatus.CANCELED, [None, None])
    await aredis.delete(names.job_key("j1"))  # the TTL ran out
    assert await store.store_result("j1", _ok(0)) == -1
    assert await backlog(store.redis, MODEL) == 0
