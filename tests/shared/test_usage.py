"""Usage counters on a real Redis: each sub-result counted with its first write and each job
with its final status, once whatever is redelivered or retried, under its owner and the Redis
server's UTC day, with the retention TTL."""

from datetime import UTC, date, datetime
from importlib import resources

import pytest

from shared.job import JobMeta, JobStatus
from shared.jobstore import Finished, JobStore, NewJob
from shared.messages import GeneratedImage, GeneratedText, SubRequest, SubResult, TextItem
from shared.throughput import BUCKET_SECONDS, finished_key
from shared.usage import read_days, subresult_usage, usage_key

OUTPUT = {"text": "x", "finish_reason": "length", "tokens": 3, "worker": "w1"}


def _result(index: int, tokens: int, prompt_tokens: int, worker: str = "w1") -> SubResult:
    return SubResult(index=index, worker=worker, started_at=100.0, finished_at=100.25,
                     output=GeneratedText(text="x", finish_reason="length", tokens=tokens,
                                          prompt_tokens=prompt_tokens))


def _sub(job_id: str, index: int) -> SubRequest:
    return SubRequest(job_id=job_id, index=index, model="tiny-gpt2",
                      item=TextItem(prompt="a", max_new_tokens=4))


async def _create(store: JobStore, job_id: str, total: int, owner: str | None) -> None:
    await store.create(NewJob(job_id, "text-generation", "tiny-gpt2", {"prompts": ["a"] * total},
                              total, JobMeta(owner=owner)))


async def _today(aredis) -> date:
    seconds, _ = await aredis.time()
    return datetime.fromtimestamp(seconds, UTC).date()


async def _usage(aredis, owner: str | None) -> dict[str, int]:
    today = await _today(aredis)
    return (await read_days(aredis, owner, [today])).get(today, {})


@pytest.mark.parametrize("when", [
    "1970-01-01T00:00:00", "1999-12-31T23:59:59", "2000-02-29T12:00:00", "2000-03-01T00:00:00",
    "2024-12-31T23:59:59", "2025-01-01T00:00:00", "2026-12-06T23:46:42", "2100-02-28T23:59:59",
    "2100-03-01T00:00:00",
])
async def test_the_scripts_utc_day_is_the_calendars(aredis, when):
    """Redis's Lua has no os.date: the fragment works the date out itself."""
    fragment = resources.files("shared.redis_scripts").joinpath(
        "fragments/utc_day.lua").read_text()
    at = datetime.fromisoformat(when).replace(tzinfo=UTC)
    got = await aredis.eval(fragment + "\nreturn utc_day(tonumber(ARGV[1]))", 0,
                            repr(at.timestamp() + 0.5))
    assert got.decode() == f"{at:%Y%m%d}"


def test_a_sub_results_usage_is_its_tokens_images_and_worker_time():
    assert subresult_usage(_result(0, tokens=7, prompt_tokens=5)) == "5 7 0 250"
    image = SubResult(index=0, output=GeneratedImage(seed=1, width=8, height=8),
                      started_at=10.0, finished_at=11.5)
    assert subresult_usage(image) == "0 0 1 1500"
    # A failure before it ran (dead-lettered) has no start: no time, nothing made.
    assert subresult_usage(SubResult(index=0, finished_at=3.0)) == "0 0 0 0"


async def test_a_sub_result_counts_once_however_often_it_is_delivered(store, aredis):
    await _create(store, "j1", 2, "key-a")
    # Worker w1 takes sub-request 0 and is lost; the janitor takes the expired lease and w2
    # runs it again and stores it; w1's own result, late, is a duplicate.
    assert (await store.acquire_lease(_sub("j1", 0), "w1", -1, 3)).outcome == "acquired"
    assert await store.claim_expired_leases() == [("j1", 0)]
    await store.release_lease("j1:0", "janitor:")
    assert (await store.acquire_lease(_sub("j1", 0), "w2", 30, 3)).outcome == "acquired"
    assert await store.store_result("j1", _result(0, 4, 2, "w2"), "tiny-gpt2") == 1
    assert await store.store_result("j1", _result(0, 4, 2, "w1"), "tiny-gpt2") == 0
    assert await store.store_result("j1", _result(1, 6, 3), "tiny-gpt2") == 1
    assert await store.finalize("j1", JobStatus.SUCCEEDED, [OUTPUT, OUTPUT])
    assert not await store.finalize("j1", JobStatus.FAILED, [None, None])
    assert await _usage(aredis, "key-a") == {
        "tiny-gpt2|prompt_tokens": 5, "tiny-gpt2|completion_tokens": 10,
        "tiny-gpt2|device_ms": 500, "tiny-gpt2|jobs_succeeded": 1}
    assert await _usage(aredis, "key-b") == {}


async def test_a_one_prompt_job_made_final_with_its_result_counts_once(store, aredis):
    await _create(store, "j1", 1, None)
    made = await store.store_last_result("j1", _result(0, 3, 2), OUTPUT, "tiny-gpt2")
    assert isinstance(made, Finished)
    assert await store.store_last_result("j1", _result(0, 3, 2), OUTPUT, "tiny-gpt2") == -2
    assert await store.store_result("j1", _result(0, 3, 2), "tiny-gpt2") == -2
    assert await _usage(aredis, None) == {
        "tiny-gpt2|prompt_tokens": 2, "tiny-gpt2|completion_tokens": 3,
        "tiny-gpt2|device_ms": 250, "tiny-gpt2|jobs_succeeded": 1}


async def test_jobs_are_counted_by_their_final_status(store, aredis):
    for job_id, status in [("a", JobStatus.CANCELED), ("b", JobStatus.FAILED),
                           ("c", JobStatus.CANCELED)]:
        await _create(store, job_id, 1, "key-a")
        assert await store.finalize(job_id, status, [None])
    assert await _usage(aredis, "key-a") == {"tiny-gpt2|jobs_canceled": 2,
                                             "tiny-gpt2|jobs_failed": 1}


async def test_a_days_counters_live_for_the_retention_under_the_servers_day(store, aredis):
    await _create(store, "j1", 1, "key-a")
    assert await store.finalize("j1", JobStatus.CANCELED, [None])
    key = usage_key("key-a", await _today(aredis))
    assert await aredis.exists(key)
    assert 399 * 86400 < await aredis.ttl(key) <= 400 * 86400


async def test_the_retention_is_a_setting(aredis, monkeypatch):
    from shared.settings import get_settings

    monkeypatch.setenv("FIBERMILL_USAGE_RETENTION_DAYS", "2")
    get_settings.cache_clear()
    try:
        store = JobStore(aredis, finished_ttl=3600)
    finally:
        get_settings.cache_clear()
    await _create(store, "j1", 1, "key-a")
    assert await store.finalize("j1", JobStatus.CANCELED, [None])
    assert 86400 < await aredis.ttl(usage_key("key-a", await _today(aredis))) <= 2 * 86400


async def test_each_written_result_counts_as_finished_for_its_model(store, aredis):
    await _create(store, "j1", 3, None)
    for index in (0, 1, 1, 2):  # one duplicate
        await store.store_result("j1", _result(index, 1, 1), "tiny-gpt2")
    seconds, _ = await aredis.time()
    bucket = seconds // BUCKET_SECONDS
    counted = [await aredis.get(finished_key("tiny-gpt2", b)) for b in (bucket - 1, bucket)]
    assert sum(int(n or 0) for n in counted) == 3
    assert 0 < await aredis.ttl(finished_key("tiny-gpt2", bucket)) <= 125


async def test_the_owner_is_the_jobs_own_field_and_no_text_can_pass_for_it(store, aredis):
    meta = JobMeta(owner=None, base_url='http://h/"owner":"key-b"',
                   webhook="https://example.com/?owner=key-b")
    await store.create(NewJob("j1", "text-generation", "tiny-gpt2", {"prompts": ["a"]}, 1, meta))
    assert await store.finalize("j1", JobStatus.CANCELED, [None])
    await _create(store, "j2", 1, "key-a")
    assert await store.finalize("j2", JobStatus.CANCELED, [None])
    assert await _usage(aredis, None) == {"tiny-gpt2|jobs_canceled": 1}
    assert await _usage(aredis, "key-a") == {"tiny-gpt2|jobs_canceled": 1}
    assert await _usage(aredis, "key-b") == {}
