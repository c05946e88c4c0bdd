"""Readiness: Redis, a live worker unless FIBERMILL_READY_REQUIRES_WORKERS is off, and not
draining; and the API server's drain at SIGTERM (services/api/serve.py)."""

import asyncio
import gc
import signal
import socket
import time

import pytest
import redis.asyncio as aioredis
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient

from services.api.app import create_app
from services.api.serve import DrainingServer
from shared.messages import WorkerHeartbeat
from shared.settings import get_settings
from shared.workers import announce


@pytest.fixture
def client_for(settings_env, monkeypatch):
    def make(**env):
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        get_settings.cache_clear()
        return TestClient(create_app())
    return make


def _announce_worker(redis_url: str) -> None:
    async def go():
        r = aioredis.Redis.from_url(redis_url)
        now = time.time()
        await announce(r, WorkerHeartbeat(id="w/1", name="w", host="h", pid=1, device="cpu",
                                     models=["digits"], started_at=now, seen_at=now), 30)
        await r.aclose()
    asyncio.run(go())


def test_not_ready_without_a_worker_by_default(client_for):
    with client_for() as c:
        r = c.get("/readyz")
    assert r.status_code == 503
    assert r.json() == {"status": "unready", "reason": "no live worker", "workers": 0}


def test_ready_with_a_live_worker(client_for, redis_url):
    _announce_worker(redis_url)
    with client_for() as c:
        r = c.get("/readyz")
    assert r.status_code == 200
    assert r.json() == {"status": "ready", "workers": 1}


def test_scale_to_zero_needs_only_redis(client_for, redis_url):
    with client_for(FIBERMILL_READY_REQUIRES_WORKERS="false") as c:
        r = c.get("/readyz")
        assert r.status_code == 200
        assert r.json() == {"status": "ready", "workers": 0}
        _announce_worker(redis_url)
        assert c.get("/readyz").json() == {"status": "ready", "workers": 1}


def test_scale_to_zero_still_needs_redis(client_for, caplog):
    with client_for(FIBERMILL_READY_REQUIRES_WORKERS="false") as c:
        c.app.state.redis = aioredis.Redis.from_url("redis://127.0.0.1:1/0")  # nothing there
        r = c.get("/readyz")
    assert r.status_code == 503
    # Only which dependency is down; where it lives is for the log, not for any caller.
    assert r.json() == {"status": "unready", "reason": "redis unavailable",
                        "redis": "unavailable"}
    assert "127.0.0.1" in caplog.text and "127.0.0.1" not in r.text


@pytest.mark.parametrize("requires", ["true", "false"])
def test_draining_is_not_ready_whatever_else(client_for, redis_url, requires):
    _announce_worker(redis_url)
    with client_for(FIBERMILL_READY_REQUIRES_WORKERS=requires) as c:
        assert c.get("/readyz").status_code == 200
        c.app.state.draining = True
        r = c.get("/readyz")
        assert r.status_code == 503 and r.json()["status"] == "draining"
        assert c.get("/healthz").status_code == 200  # alive all the same


def _server(drain: float) -> DrainingServer:
    app = FastAPI()
    return DrainingServer(uvicorn.Config(app), app, drain)


def test_once_started_what_the_app_built_is_out_of_the_collectors_full_passes():
    from services.devstack.redis_server import free_port

    app = FastAPI()
    server = DrainingServer(uvicorn.Config(app, port=free_port(), log_config=None), app, 0)
    server.config.load()
    server.lifespan = server.config.lifespan_class(server.config)

    async def started() -> int:
        await server.startup()
        try:
            return gc.get_freeze_count()
        finally:
            await server.shutdown()

    gc.unfreeze()
    try:
        assert asyncio.run(started()) > 0
    finally:
        gc.unfreeze()  # this process's objects back in the collector's care


def test_sigterm_drains_before_uvicorn_shuts_down():
    server = _server(0.3)
    assert server.app.state.draining is False
    server.handle_exit(signal.SIGTERM, None)
    assert server.app.state.draining is True
    assert not server.should_exit  # the socket stays open for the drain delay
    assert asyncio.run(server.on_tick(1)) is False
    time.sleep(0.35)
    assert asyncio.run(server.on_tick(2)) is True and server.should_exit
    assert not server.force_exit
    assert server._captured_signals == []  # not raised again after shutdown: the exit is 0


def test_second_sigterm_skips_the_rest_of_the_drain_then_forces():
    server = _server(60)
    server.handle_exit(signal.SIGTERM, None)
    server.handle_exit(signal.SIGTERM, None)
    assert server.should_exit and not server.force_exit
    server.handle_exit(signal.SIGTERM, None)
    assert server.force_exit


@pytest.mark.parametrize(("sig", "drain"), [(signal.SIGINT, 5), (signal.SIGTERM, 0)])
def test_sigint_or_no_drain_shuts_down_at_once(sig, drain):
    server = _server(drain)
    server.handle_exit(sig, None)
    assert server.should_exit and server.app.state.draining


def test_not_ready_while_the_blob_store_cannot_be_used(client_for, redis_url, tmp_path):
    _announce_worker(redis_url)
    mount = tmp_path / "volume"
    mount.write_text("a volume mounted wrong")
    with client_for(FIBERMILL_BLOB_DIR=str(mount / "blobs"),
                    FIBERMILL_READY_REQUIRES_WORKERS="false") as client:
        resp = client.get("/readyz")
        assert resp.status_code == 503
        assert resp.json() == {"status": "unready", "reason": "blob store unavailable",
                               "blob_store": "unavailable"}
        assert str(mount) not in resp.text
        mount.unlink()
        mount.mkdir()
        assert client.get("/readyz").status_code == 200


def test_an_unreachable_s3_store_is_named_but_not_where_it_is(client_for, caplog):
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    endpoint, bucket = f"http://127.0.0.1:{port}", "tenant-private-bucket"
    with client_for(FIBERMILL_READY_REQUIRES_WORKERS="false", FIBERMILL_BLOB_BACKEND="s3",
                    FIBERMILL_S3_ENDPOINT_URL=endpoint, FIBERMILL_S3_BUCKET=bucket,
                    FIBERMILL_S3_ACCESS_KEY_ID="k", FIBERMILL_S3_SECRET_ACCESS_KEY="s",
                    FIBERMILL_BLOB_MAX_ATTEMPTS="1") as client:
        resp = client.get("/readyz")
    assert resp.status_code == 503
    assert resp.json() == {"status": "unready", "reason": "blob store unavailable",
                           "blob_store": "unavailable"}
    for secret in (bucket, str(port), "127.0.0.1"):
        assert secret not in resp.text
    assert bucket in caplog.text  # the operator still learns which store failed, and how


def test_a_restarting_loop_is_named_without_its_error(client_for):
    with client_for(FIBERMILL_READY_REQUIRES_WORKERS="false") as client:
        sweeper = next(loop for loop in client.app.state.loops if loop.name == "sweeper")
        sweeper.running = False
        sweeper.last_error = "BlobStoreUnavailable: blob store s3://tenant-private-bucket down"
        resp = client.get("/readyz")
    assert resp.status_code == 503
    assert resp.json() == {"status": "unready", "reason": "restarting sweeper",
                           "loops": {"sweeper": "restarting"}}
