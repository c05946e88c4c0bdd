"""A model whose queue is full gets 503 + Retry-After, and a refused job leaves nothing behind.
Queue depth counts every interactive priority list of the model's queue; batch lines, queued in
a step of their own, never refuse an interactive job."""

import asyncio

import pytest
import redis
from fastapi.testclient import TestClient

from services.api.app import create_app
from services.api.backpressure import QueueDepths, check_backpressure
from shared import names
from shared.errors import InvalidInput, ServiceUnavailable
from shared.job import BATCH_PRIORITY, JobStatus
from shared.jobstore import JobRecord
from shared.messages import SubRequest, TextItem
from shared.queue_depth import batch_depth, priority_lists, queue_depth
from shared.registry import load_registry
from shared.settings import Settings, get_settings


def _text(n: int, priority: int = 5) -> dict:
    prompts = [f"p{i}" for i in range(n)]
    return {"task": "text-generation", "model": "tiny-gpt2", "priority": priority,
            "input": {"prompts": prompts}}


@pytest.fixture
def client(settings_env, monkeypatch):
    monkeypatch.setenv("FIBERMILL_MAX_QUEUE_DEPTH", "3")
    get_settings.cache_clear()
    with TestClient(create_app()) as c:
        yield c


def _stored_jobs(redis_url) -> int:
    with redis.Redis.from_url(redis_url) as r:
        keys = r.scan_iter(match=f"{names.PREFIX}:job:*")
        return sum(1 for k in keys if k.count(b":") == 2)  # fm:job:<id>, not its sub-keys


async def test_full_queue_is_503_and_nothing_is_stored_or_enqueued(client, aredis, redis_url):
    assert client.post("/v1/jobs", json=_text(2, priority=9)).status_code == 202
    # 2 queued + 2 more would pass the limit of 3, whatever their priority.
    refused = client.post("/v1/jobs", json=_text(2, priority=0))
    assert refused.status_code == 503, refused.text
    assert int(refused.headers["Retry-After"]) >= 1
    body = refused.json()
    assert body["code"] == "unavailable"
    assert "tiny-gpt2" in body["detail"] and "2 sub-requests queued" in body["detail"]
    assert "limit is 3" in body["detail"]
    assert await queue_depth(aredis, "tiny-gpt2") == 2
    assert _stored_jobs(redis_url) == 1
    # One more still fits; then the queue is full.
    assert client.post("/v1/jobs", json=_text(1, priority=0)).status_code == 202
    assert client.post("/v1/jobs", json=_text(1)).status_code == 503
    assert await queue_depth(aredis, "tiny-gpt2") == 3 and _stored_jobs(redis_url) == 2
    page = client.get("/metrics").text  # per priority list: 2 at priority 9, 1 at 0
    assert 'fibermill_queue_depth{model="tiny-gpt2",priority="9"} 2.0' in page
    assert 'fibermill_queue_depth{model="tiny-gpt2",priority="0"} 1.0' in page
    # Other models have queues and limits of their own.
    digits = {"task": "image-generation", "model": "digits", "input": {"prompts": ["7"]}}
    assert client.post("/v1/jobs", json=digits).status_code == 202


async def test_the_models_own_limit_wins(aredis, model_dir):
    registry = load_registry(model_dir / "registry.yaml")
    spec = registry.get("digits").model_copy(update={"max_queue_depth": 2})
    settings = Settings(max_queue_depth=1000)
    await aredis.lpush(priority_lists("digits")[7], "queued")
    await check_backpressure(aredis, spec, settings, incoming=1)
    with pytest.raises(ServiceUnavailable) as err:
        await check_backpressure(aredis, spec, settings, incoming=2)
    assert "digits" in str(err.value) and "limit is 2" in str(err.value)
    assert err.value.retry_after >= 1
    # Without its own limit the model gets the global one.
    await check_backpressure(aredis, registry.get("digits"), settings, incoming=999)
    with pytest.raises(ServiceUnavailable):
        await check_backpressure(aredis, registry.get("digits"), settings, incoming=1000)


async def test_queue_depth_counts_every_priority_list(dispatcher, aredis):
    job = JobRecord("j1", "image-generation", "digits", JobStatus.QUEUED,
                    {"prompts": ["1", "2", "3"]}, 0, 0.0)
    subs = dispatcher.subrequests(job)
    assert len(subs) == 3
    await dispatcher.send(subs[:1], 0)
    await dispatcher.send(subs[1:2], 4)
    await dispatcher.send(subs[2:], 9)
    lists = priority_lists("digits")
    assert lists[0] == names.queue_for("digits") and lists[9] == "fibermill.digits:9"
    assert [await aredis.llen(k) for k in lists] == [1, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0]
    assert await queue_depth(aredis, "digits") == 3
    assert await queue_depth(aredis, "tiny-gpt2") == 0
    with pytest.raises(ValueError):
        await dispatcher.send(subs, BATCH_PRIORITY + 1)


async def test_batch_lines_queued_never_refuse_an_interactive_job(client, aredis, dispatcher):
    subs = [SubRequest(job_id="b1", index=i, model="tiny-gpt2",
                       item=TextItem(prompt="x", max_new_tokens=1)) for i in range(5)]
    await dispatcher.send(subs, BATCH_PRIORITY)
    assert await batch_depth(aredis, "tiny-gpt2") == 5
    assert await queue_depth(aredis, "tiny-gpt2") == 0
    # 5 batch sub-requests queued and 3 more would pass the limit of 3: not counted.
    assert client.post("/v1/jobs", json=_text(3)).status_code == 202
    refused = client.post("/v1/jobs", json=_text(1))  # the interactive backlog is what counts
    assert refused.status_code == 503 and "3 sub-requests queued" in refused.json()["detail"]


async def test_a_replica_reads_a_queue_far_from_its_limit_at_most_once_a_second(
    aredis, model_dir, monkeypatch
):
    from services.api import backpressure

    monkeypatch.setattr(backpressure, "FRESH_SECONDS", 0.3)
    spec = load_registry(model_dir / "registry.yaml").get("digits")
    depths = QueueDepths(aredis, Settings(max_queue_depth=100))

    async def reads() -> int:
        stats = await aredis.info("commandstats")
        return stats.get("cmdstat_llen", {}).get("calls", 0) // BATCH_PRIORITY  # its lists

    await aredis.config_resetstat()
    for _ in range(10):  # under half the limit: one read, then what this replica added
        await depths.check(spec, 1)
        depths.added("digits", 1)
    assert await reads() == 1
    await aredis.lpush(priority_lists("digits")[3], *["queued"] * 60)  # another replica's
    await depths.check(spec, 1)  # not seen yet: within the limit's guard, as documented
    assert await reads() == 1
    await asyncio.sleep(0.35)
    await depths.check(spec, 1)  # read again: 60 queued, past half the limit
    await depths.check(spec, 1)
    assert await reads() == 3  # near the limit every check reads
    await aredis.lpush(priority_lists("digits")[0], *["queued"] * 40)
    with pytest.raises(ServiceUnavailable) as err:
        await depths.check(spec, 1)
    assert "100 sub-requests queued" in str(err.value)
    with pytest.raises(InvalidInput):
        await depths.check(spec, 101)  # could never fit


async def test_checks_that_need_a_read_while_one_is_under_way_share_it(aredis, model_dir):
    spec = load_registry(model_dir / "registry.yaml").get("digits")
    depths = QueueDepths(aredis, Settings(max_queue_depth=100))
    await aredis.config_resetstat()
    await asyncio.gather(*(depths.check(spec, 1) for _ in range(32)))
    stats = await aredis.info("commandstats")
    # One read of the interactive lists (the batch list is not counted).
    assert stats["cmdstat_llen"]["calls"] == len(priority_lists("digits")) - 1
