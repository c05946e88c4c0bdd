"""Background loops that cannot die: restarted after any error, Redis down at start included,
and reported by /readyz while they are not running."""

import asyncio

import redis.asyncio as aioredis
from fastapi.testclient import TestClient
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from services.api import supervisor
from services.api.app import create_app
from services.api.joiner import Joiner
from services.api.supervisor import Supervised
from services.devstack.redis_server import free_port, start_redis
from shared import names


async def test_a_loop_that_fails_is_restarted_and_says_so(monkeypatch):
    monkeypatch.setattr(supervisor, "BACKOFF_SECONDS", (0.01,))
    calls, seen_running = 0, []
    forever = asyncio.Event()

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionError(f"down {calls}")
        await forever.wait()

    loop = Supervised("flaky", flaky)
    task = asyncio.create_task(loop.run())
    for _ in range(100):
        seen_running.append(loop.running)
        if calls >= 3:
            break
        await asyncio.sleep(0.005)
    assert calls == 3 and loop.running and loop.restarts == 2
    assert loop.last_error == "ConnectionError: down 2"
    assert False in seen_running  # not running while it waited to restart
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert not loop.running


async def test_a_joiner_started_while_redis_is_down_joins_once_it_is_up(
    tmp_path, settings, monkeypatch
):
    monkeypatch.setattr(supervisor, "BACKOFF_SECONDS", (0.05,))
    port = free_port()
    # No retries in the client: its default retries a refused connection with random backoff
    # that could outlast the wait below, and what is tested is the supervisor's restarts.
    client = aioredis.Redis(port=port, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    joiner = Supervised("joiner", Joiner(client, None, settings, "api-1").run)
    task = asyncio.create_task(joiner.run())
    for _ in range(100):
        if joiner.restarts:
            break
        await asyncio.sleep(0.05)
    assert joiner.restarts >= 1  # Redis is not there yet: each start failed
    assert joiner.last_error.startswith("ConnectionError")
    redis_proc = start_redis(port, tmp_path / "redis", appendonly=False)
    try:
        for _ in range(100):
            if joiner.running and await _has_group(client):
                break
            await asyncio.sleep(0.05)
        assert joiner.running and await _has_group(client)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.aclose()
        redis_proc.terminate()
        redis_proc.wait()


async def _has_group(client: aioredis.Redis) -> bool:
    try:
        groups = await client.xinfo_groups(names.COMPLETIONS_STREAM)
    except Exception:
        return False
    return any(g["name"] in (names.JOINER_GROUP, names.JOINER_GROUP.encode()) for g in groups)


def test_readyz_is_503_while_a_loop_is_down(settings_env):
    with TestClient(create_app()) as client:
        loops = client.app.state.loops
        assert {loop.name for loop in loops} == {"joiner", "janitor", "webhooks", "events",
                                                  "sweeper", "batches"}
        joiner = next(loop for loop in loops if loop.name == "joiner")
        joiner.running, joiner.last_error = False, "ConnectionError: gone"
        resp = client.get("/readyz")
        assert resp.status_code == 503 and resp.json()["loops"] == {"joiner": "restarting"}
