"""A job's timeline, from the timestamps its lease and result scripts write into its record, on
a real Redis."""

import time

import pytest

from shared.jobstore import Finished, JobStore, NewJob
from shared.messages import GeneratedText, SubRequest, SubResult, TextItem
from shared.timeline import ran_value, timeline_in


def _sub(index: int) -> SubRequest:
    return SubRequest(job_id="j1", index=index, model="tiny-gpt2",
                      item=TextItem(prompt="a", max_new_tokens=2))


def _micro(x: float):
    """`x` to the microsecond, as a datetime holds it."""
    return pytest.approx(x, abs=2e-6)


def _result(index: int, started: float, worker: str) -> SubResult:
    return SubResult(index=index, worker=worker, started_at=started - 0.5,
                     run_started_at=started, finished_at=started + 0.25,
                     output=GeneratedText(text="x", finish_reason="length", tokens=1))


async def test_each_sub_request_keeps_when_it_was_leased_started_and_finished(store: JobStore):
    rec = await store.create(NewJob("j1", "text-generation", "tiny-gpt2", {"prompts": ["a"]}, 2))
    before = time.time()
    assert (await store.acquire_lease(_sub(0), "w1/1", 30, 3, charge=True)).outcome == "acquired"
    await store.acquire_lease(_sub(1), "w2/2", 30, 3)
    timeline = (await store.get("j1", timeline=True)).timeline
    assert timeline is not None and [t.index for t in timeline] == [0, 1]
    first, second = timeline
    # Leased (Redis's clock, the same machine's), not yet run: the lease holder is its worker.
    assert first.queued_at.timestamp() == _micro(rec.created_at)
    assert first.leased_at is not None and first.leased_at.timestamp() >= before - 1
    assert (first.started_at, first.finished_at, first.attempts, first.worker) == (
        None, None, 1, "w1/1")
    assert (second.attempts, second.worker) == (0, "w2/2")

    t = time.time()
    assert await store.store_result("j1", _result(0, t, "w1/1"), model="tiny-gpt2") == 1
    assert await store.store_result("j1", _result(1, t + 1, "w2/2"), model="tiny-gpt2") == 1
    first, second = (await store.get("j1", timeline=True)).timeline or []
    # The device start, not the lease on the worker; the worker stays named once released.
    assert first.started_at is not None and first.started_at.timestamp() == _micro(t)
    assert first.finished_at is not None and first.finished_at.timestamp() == _micro(t + 0.25)
    assert first.worker == "w1/1" and second.worker == "w2/2"
    assert (await store.get("j1")).timeline is None  # read only when asked


async def test_a_one_prompt_job_made_final_with_its_result_keeps_its_timing(store: JobStore):
    await store.create(NewJob("j1", "text-generation", "tiny-gpt2", {"prompts": ["a"]}, 1))
    await store.acquire_lease(_sub(0), "w1/1", 30, 3, charge=True)
    t = time.time()
    done = await store.store_last_result("j1", _result(0, t, "w1/1"), {"text": "x"},
                                         model="tiny-gpt2")
    assert isinstance(done, Finished)
    (only,) = (await store.get("j1", timeline=True)).timeline or []
    assert only.started_at is not None and only.started_at.timestamp() == _micro(t)
    assert (only.attempts, only.worker) == (1, "w1/1")
    assert only.leased_at is not None and only.finished_at is not None


def test_a_record_without_timing_reads_as_not_started():
    (t,) = timeline_in({b"ran:0": ran_value(None, 2.0, "w 1").encode()}, 1, 1.0)
    assert (t.leased_at, t.started_at, t.attempts, t.worker) == (None, None, 0, "w 1")
    assert t.finished_at is not None and t.finished_at.timestamp() == 2.0
