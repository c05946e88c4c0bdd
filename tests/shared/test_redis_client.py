"""The services' Redis client rides out a Redis restart and a paused Redis: a submission made
while Redis is away is accepted once it is back, stored once, not answered with a 5xx."""

import os
import signal
import threading
import time

import pytest
import redis
from fastapi.testclient import TestClient

from services.devstack.redis_server import free_port, start_redis

TEXT = {"task": "text-generation", "model": "tiny-gpt2", "input": {"prompts": ["a", "b"]}}


@pytest.fixture
def own_redis(tmp_path, model_dir, monkeypatch):
    """A Redis of this test's own, with AOF, that the test may kill and restart."""
    from shared.settings import get_settings

    port = free_port()
    procs = [start_redis(port, tmp_path / "redis")]
    monkeypatch.setenv("FIBERMILL_REDIS_URL", f"redis://127.0.0.1:{port}/0")
    monkeypatch.setenv("FIBERMILL_MODEL_REGISTRY", str(model_dir / "registry.yaml"))
    monkeypatch.setenv("FIBERMILL_REDIS_RETRY_SECONDS", "15")
    get_settings.cache_clear()

    def restart_after(seconds: float) -> threading.Thread:
        def go():
            time.sleep(seconds)
            procs.append(start_redis(port, tmp_path / "redis"))
        t = threading.Thread(target=go)
        t.start()
        return t

    yield port, procs, restart_after
    get_settings.cache_clear()
    for p in procs:
        p.kill()
        p.wait()


def _jobs(port: int) -> list[bytes]:
    with redis.Redis(port=port) as r:
        return [k for k in r.scan_iter("fm:job:*") if k.count(b":") == 2]


def test_a_submission_during_a_redis_restart_is_accepted_once(own_redis):
    from services.api.app import create_app

    port, procs, restart_after = own_redis
    with TestClient(create_app()) as client:
        assert client.post("/v1/jobs", json=TEXT).status_code == 202
        procs[0].kill()  # SIGKILL: it restarts on its AOF
        procs[0].wait()
        restarting = restart_after(2.0)
        t0 = time.monotonic()
        resp = client.post("/v1/jobs", json=TEXT)
        waited = time.monotonic() - t0
        restarting.join()
        assert resp.status_code == 202, resp.text
        assert waited >= 1.5  # it waited for Redis rather than failing
        job = client.get(f"/v1/jobs/{resp.json()['id']}").json()
        assert job["status"] == "queued"
    assert len(_jobs(port)) == 2  # both jobs, each stored once


def test_a_paused_redis_delays_a_submission_and_stores_it_once(own_redis):
    from services.api.app import create_app

    port, procs, _ = own_redis
    with TestClient(create_app()) as client:
        os.kill(procs[0].pid, signal.SIGSTOP)
        threading.Timer(7.0, os.kill, (procs[0].pid, signal.SIGCONT)).start()
        resp = client.post("/v1/jobs", json=TEXT, headers={"Idempotency-Key": "paused"})
        assert resp.status_code == 202, resp.text
    assert len(_jobs(port)) == 1  # the command sent again after a timeout stored nothing twice


async def test_a_burst_past_the_pool_waits_for_a_connection(redis_url, monkeypatch):
    """More commands at once than the pool has connections: they queue for one, none fails
    with "too many connections" (as they would while a paused Redis holds every connection)."""
    import asyncio

    from shared import redis_client
    from shared.settings import Settings

    monkeypatch.setattr(redis_client, "MAX_CONNECTIONS", 4)
    client = redis_client.connect(Settings(redis_url=redis_url))
    try:
        got = await asyncio.gather(*(client.blpop([f"fm:test:nothing:{i}"], timeout=0.2)
                                     for i in range(12)))
        assert got == [None] * 12
    finally:
        await client.aclose()
