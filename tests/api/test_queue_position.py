"""A queued job's place in line and estimated start, on the real app and Redis: with no worker
the k-th of N queued jobs is k-th in line and has no estimate (nothing measured); once a real
worker has run some, the model's throughput is measured and the estimate appears. A read of a
queued job costs one script call beside the job's own read."""

import os
import signal
import time
from datetime import datetime

import pytest
from fastapi.testclient import TestClient

from services.api.app import create_app
from services.api.queue_position import queue_position, within_the_lists
from shared.jobstore import NewJob
from shared.queue_depth import priority_lists
from shared.redis_scripts.queue import QueueReading
from tests.api.worker_process import wait_for, wait_until_ready, worker_process

JOBS = 10


def _digits(steps: int) -> dict:
    return {"model": "digits", "input": {"prompts": ["3"], "steps": steps, "seed": 1}}


@pytest.fixture
def client(settings_env):
    with TestClient(create_app()) as c:
        yield c


def test_queued_jobs_are_in_line_in_order_and_unestimated_until_work_is_measured(
        client, redis_url, model_dir, tmp_path):
    ids = [client.post("/v1/jobs", json=_digits(300)).json()["id"] for _ in range(JOBS)]
    for k, job_id in enumerate(ids, start=1):
        job = client.get(f"/v1/jobs/{job_id}").json()
        assert job["status"] == "queued"
        assert job["queue"] == {"position": k, "ahead": k - 1, "estimated_start": None,
                                "basis": None}
    # Only the job's own read says where it stands: a list does not.
    assert all(j["queue"] is None for j in client.get("/v1/jobs").json()["jobs"])

    log = tmp_path / "workers.log"
    with worker_process(redis_url, model_dir, tmp_path / "blobs", "digits", log) as proc:
        wait_until_ready(client, proc, log)
        wait_for(client, ids[1], {"succeeded"})
        os.killpg(proc.pid, signal.SIGSTOP)  # what is queued now stays queued
        try:
            before = time.time()
            last = client.get(f"/v1/jobs/{ids[-1]}").json()
            after = time.time()
        finally:
            os.killpg(proc.pid, signal.SIGCONT)
    assert last["status"] == "queued", last
    queue = last["queue"]
    assert queue["position"] == queue["ahead"] + 1 <= JOBS - 2
    basis = queue["basis"]
    assert basis["finished"] >= 2 and basis["per_second"] > 0
    assert basis["per_second"] == pytest.approx(basis["finished"] / basis["seconds"], rel=1e-3)
    start = datetime.fromisoformat(queue["estimated_start"]).timestamp()
    wait = queue["ahead"] / basis["per_second"]
    assert before + wait - 1 <= start <= after + wait + 1


def test_a_job_that_is_not_queued_has_no_place_in_line(client):
    job = client.post("/v1/jobs", json=_digits(5)).json()
    canceled = client.post(f"/v1/jobs/{job['id']}/cancel").json()
    assert canceled["status"] == "canceled" and canceled["queue"] is None
    assert client.get(f"/v1/jobs/{job['id']}").json()["queue"] is None


async def test_a_queued_jobs_place_is_one_round_trip(store, aredis):
    await store.create(NewJob("j1", "image-generation", "digits", {"prompts": ["3"]}, 1))
    rec = await store.get("j1")
    assert (await queue_position(aredis, rec, 120)).position == 1  # its script loaded
    await aredis.config_resetstat()
    assert (await queue_position(aredis, rec, 900)).ahead == 0
    stats = await aredis.info("commandstats")
    calls = {k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()
             if k not in ("cmdstat_info", "cmdstat_config|resetstat")}
    # One EVALSHA; inside it the rank, the backlog's size, one LLEN per priority list, the
    # time, and one MGET of the window's 180 buckets.
    assert calls == {"evalsha": 1, "zrank": 1, "zcard": 1, "time": 1, "mget": 1,
                     "llen": len(priority_lists("digits"))}


def test_more_urgent_work_sent_later_goes_ahead_and_less_urgent_work_does_not(client):
    late = [client.post("/v1/jobs", json={**_digits(5), "priority": 9}).json()["id"]
            for _ in range(3)]
    urgent = client.post("/v1/jobs", json={**_digits(5), "priority": 0}).json()["id"]
    # Sent last, taken first: nothing is ahead of it, whatever was sent before.
    assert client.get(f"/v1/jobs/{urgent}").json()["queue"]["position"] == 1
    # Sent first at its priority, it still waits for the more urgent one sent after it.
    assert client.get(f"/v1/jobs/{late[0]}").json()["queue"]["position"] == 2


def _reading(rank: int, outstanding: int, urgent: int, same: int, waiting: int) -> QueueReading:
    return QueueReading(rank, outstanding, urgent, same, waiting, 0.0, [])


def test_the_send_order_is_kept_within_what_the_priority_lists_allow():
    # All at one priority, none taken: the send order is the place.
    assert within_the_lists(_reading(4, 10, 0, 10, 10)) == 4
    # 100 less urgent sub-requests sent before it, 2 running: only the 2, and its own list's
    # other one, can be ahead.
    assert within_the_lists(_reading(102, 106, 0, 2, 104)) == 3
    # 5 more urgent ones wait, sent after it: they are ahead whatever its rank.
    assert within_the_lists(_reading(1, 8, 5, 3, 8)) == 5
