"""With Redis Sentinel, every client follows a failover without a restart: the services' client
(commands and scripts on the promoted replica), the Celery transport (a message sent before the
primary died is taken from the new one), and the writes that make a job wait for a replica
(WAIT), so that an acknowledged job is on the replica a failover promotes. A real primary,
replica and three sentinels, each a process (services/devstack/redis_sentinel.py)."""

import asyncio
import contextlib
import time

import pytest
import redis
from kombu import Connection

from services.devstack.redis_sentinel import SentinelGroup
from services.worker.cancellation import CancelListener
from services.worker.flights import Flights
from shared import names
from shared.celery_config import SENTINEL_TRANSPORT, broker
from shared.errors import NotReplicated
from shared.jobstore import JobStore, NewJob
from shared.redis_client import connect, connect_sync, primary_address
from shared.replication import UNREPLICATED
from shared.settings import Settings


@pytest.fixture
def group(tmp_path):
    # Two replicas: after a failover one is left to acknowledge writes (with one, every job
    # waits for the old primary to come back as a replica: test_a_job_reaching_no_replica...).
    g = SentinelGroup(tmp_path, replicas=2)
    g.start()
    yield g
    g.stop()


def _settings(group: SentinelGroup, **more) -> Settings:
    return Settings(**{"redis_url": "redis://127.0.0.1/0",
                       "redis_sentinels": group.sentinel_addresses,
                       "redis_sentinel_master": group.master, "redis_retry_seconds": 20, **more})


def _fail_over(group: SentinelGroup) -> int:
    old = group.primary()
    group.kill(old)
    return group.wait_failover(old.port)


async def test_the_client_finds_the_primary_and_follows_a_failover(group):
    settings = _settings(group)
    assert primary_address(settings) == ("127.0.0.1", group.nodes[0].port)
    client = connect(settings)
    store = JobStore(client)
    try:
        await store.create(NewJob("before", "text-generation", "tiny-gpt2", {"prompts": ["a"]}, 1))
        old = group.primary()
        group.kill(old)
        # A command while the sentinels agree on a new primary waits and lands on it.
        await store.create(NewJob("after", "text-generation", "tiny-gpt2", {"prompts": ["a"]}, 1))
        new = group.wait_failover(old.port)
        assert new != old.port
        # The job acknowledged before the failover was on the replica (WAIT), the one after it
        # is on the new primary; both read back through the same client.
        assert {(await store.get(j)).id for j in ("before", "after")} == {"before", "after"}
        with redis.Redis(port=new) as direct:
            assert direct.exists(names.job_key("before"), names.job_key("after")) == 2
    finally:
        await client.aclose()


async def test_a_demoted_primary_is_left_for_the_new_one(group):
    """The old primary back as a replica answers writes with READONLY: the client reconnects
    through the sentinels instead of failing."""
    settings = _settings(group)
    client = connect(settings)
    try:
        await client.set("k", "1")
        old = group.primary()
        group.kill(old)
        group.wait_failover(old.port)
        group.restart_as_replica(old)
        group.wait_synced(old)
        for i in range(20):  # connections in the pool, old and new, all end on the primary
            await client.set(f"k{i}", i)
        assert await client.get("k") == b"1"
    finally:
        await client.aclose()


async def test_a_job_reaching_no_replica_is_a_503_that_a_retry_finds(group):
    """WAIT keeps timing out while the replicas are paused: past the client's patience (its
    retry window) the create raises NotReplicated, which holds the job as stored (it still
    runs; a retry with its Idempotency-Key returns it)."""
    settings = _settings(group, redis_replica_timeout_ms=300, redis_retry_seconds=1)
    client = connect(settings)
    store = JobStore(client)
    before = UNREPLICATED.labels("create_job")._value.get()
    replicas = [n for n in group.nodes if n.port != group.primary_port()]
    try:
        for replica in replicas:
            group.pause(replica)
        t0 = time.monotonic()
        with pytest.raises(NotReplicated) as caught:
            await store.create(NewJob("j1", "text-generation", "tiny-gpt2", {"prompts": ["a"]},
                                      1))
        assert 0.9 <= time.monotonic() - t0 < 5
        assert caught.value.job.id == "j1" and (caught.value.acked, caught.value.wanted) == (0, 1)
        assert UNREPLICATED.labels("create_job")._value.get() == before + 1
        for replica in replicas:
            group.resume(replica)
        assert (await store.get("j1")).id == "j1"
        # With the replicas back, the next one is acknowledged by them.
        await store.create(NewJob("j2", "text-generation", "tiny-gpt2", {"prompts": ["a"]}, 1))
    finally:
        for node in group.nodes:
            group.resume(node)
        await client.aclose()


async def test_a_replica_back_within_the_patience_costs_latency_not_a_refusal(group):
    settings = _settings(group, redis_replica_timeout_ms=200, redis_retry_seconds=10)
    client = connect(settings)
    store = JobStore(client)
    replicas = [n for n in group.nodes if n.port != group.primary_port()]
    try:
        for replica in replicas:
            group.pause(replica)
        loop = asyncio.get_running_loop()
        loop.call_later(1.0, lambda: [group.resume(r) for r in replicas])
        t0 = time.monotonic()
        rec = await store.create(NewJob("j1", "text-generation", "tiny-gpt2", {"prompts": ["a"]},
                                        1))
        assert rec.id == "j1" and 0.9 <= time.monotonic() - t0 < 5
    finally:
        for node in group.nodes:
            group.resume(node)
        await client.aclose()


async def test_scripts_are_loaded_again_on_a_promoted_replica(group):
    """A script the old primary had cached is sent by its SHA; the new primary, which never
    loaded it, answers NOSCRIPT and the client loads it there."""
    settings = _settings(group)
    client = connect(settings)
    store = JobStore(client)
    try:
        await store.create(NewJob("a", "text-generation", "tiny-gpt2", {"prompts": ["a"]}, 1))
        new = _fail_over(group)
        with redis.Redis(port=new) as direct:
            direct.script_flush()
        await store.create(NewJob("b", "text-generation", "tiny-gpt2", {"prompts": ["a"]}, 1))
        assert (await store.get("b")).id == "b"
    finally:
        await client.aclose()


def test_the_celery_transport_takes_messages_from_the_new_primary(group):
    """A message sent before the primary died is taken from the promoted replica by a
    connection opened as a Celery consumer reopens its own after losing the broker."""
    settings = _settings(group)
    url, transport, options = broker(settings)
    assert transport == SENTINEL_TRANSPORT
    queue = "fibermill.sentinel-test"

    def connection() -> Connection:
        return Connection(url, transport=transport, transport_options=options)

    with connection() as conn, conn.SimpleQueue(queue) as q:
        q.put({"n": 1})
        old = group.primary()
        with redis.Redis(port=old.port) as direct:
            assert direct.wait(1, 2000) >= 1  # on a replica before the primary dies
    group.kill(old)
    group.wait_failover(old.port)
    with connection() as conn, conn.SimpleQueue(queue) as q:
        got = q.get(timeout=30)
        assert got.payload == {"n": 1}
        got.ack()
        q.put({"n": 2})
        again = q.get(timeout=30)
        assert again.payload == {"n": 2}
        again.ack()
    with redis.Redis(port=group.primary_port()) as direct:
        assert direct.llen("fibermill.sentinel-test") == 0


def test_the_blocking_client_follows_the_sentinels_too(group):
    settings = _settings(group)
    with connect_sync(settings) as client:
        client.set("x", "1")
    new = _fail_over(group)
    with connect_sync(settings, socket_timeout=5) as client:
        assert client.get("x") == b"1"
        assert client.connection_pool.get_master_address()[1] == new


def test_sentinels_must_be_host_port():
    with pytest.raises(ValueError, match="host:port"):
        Settings(redis_sentinels="127.0.0.1:26379,nohost")
    s = Settings(redis_sentinels="a:1, b:2")
    assert s.sentinel_addresses == [("a", 1), ("b", 2)]
    assert s.replicas_to_wait == 1
    assert Settings().replicas_to_wait == 0
    assert Settings(redis_sentinels="a:1", redis_min_replicas=2).replicas_to_wait == 2


def test_broker_url_names_every_sentinel_and_the_nodes_password():
    s = Settings(redis_url="redis://:p%40ss@ignored:1/3", redis_sentinels="h1:1,h2:2",
                 redis_sentinel_master="m", redis_sentinel_password="sp")
    url, _, options = broker(s)
    assert url == "sentinel://:p%40ss@h1:1/3;sentinel://:p%40ss@h2:2/3"
    assert options == {"master_name": "m", "sentinel_kwargs": {"password": "sp"}}


async def test_a_primary_short_of_replicas_is_waited_for(tmp_path):
    """NOREPLICAS (`min-replicas-to-write`, as deploy/k8s sets it) is retried like an outage:
    a write lands once a replica connects, instead of failing at once."""
    from services.devstack.redis_server import free_port, start_redis

    port = free_port()
    primary = start_redis(port, tmp_path / "p", args=["--min-replicas-to-write", "1"])
    replica = None
    client = connect(Settings(redis_url=f"redis://127.0.0.1:{port}/0", redis_retry_seconds=15))
    try:
        def attach() -> None:
            nonlocal replica
            replica = start_redis(free_port(), tmp_path / "r",
                                  args=["--replicaof", "127.0.0.1", str(port)])

        asyncio.get_running_loop().call_later(1.0, attach)
        t0 = time.monotonic()
        await client.set("k", "v")
        assert time.monotonic() - t0 >= 0.9
        assert await client.get("k") == b"v"
    finally:
        await client.aclose()
        for proc in (primary, replica):
            if proc is not None:
                proc.kill()
                proc.wait()


def test_the_api_answers_503_not_replicated_and_the_retry_returns_the_job(group, model_dir,
                                                                         monkeypatch):
    from fastapi.testclient import TestClient

    from services.api.app import create_app
    from shared.settings import get_settings

    for name, value in group.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("FIBERMILL_MODEL_REGISTRY", str(model_dir / "registry.yaml"))
    monkeypatch.setenv("FIBERMILL_REDIS_RETRY_SECONDS", "1")
    monkeypatch.setenv("FIBERMILL_REDIS_REPLICA_TIMEOUT_MS", "300")
    get_settings.cache_clear()
    body = {"task": "text-generation", "model": "tiny-gpt2", "input": {"prompts": ["a"]}}
    headers = {"Idempotency-Key": "k-1"}
    replicas = [n for n in group.nodes if n.port != group.primary_port()]
    try:
        with TestClient(create_app()) as client:
            for replica in replicas:
                group.pause(replica)
            refused = client.post("/v1/jobs", json=body, headers=headers)
            for replica in replicas:
                group.resume(replica)
            assert refused.status_code == 503 and refused.json()["code"] == "not_replicated"
            assert refused.headers["Retry-After"] == "2"
            again = client.post("/v1/jobs", json=body, headers=headers)
            assert again.status_code == 200
            assert [j["id"] for j in client.get("/v1/jobs").json()["jobs"]] == \
                [again.json()["id"]]
    finally:
        for node in group.nodes:
            group.resume(node)
        get_settings.cache_clear()


class _Watched(Flights):
    """Flights that remember which jobs a watch notice named (none are held here)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def watch_job(self, job_id: str) -> int:
        self.seen.append(job_id)
        return 0


async def _published_until_seen(client, flights: _Watched, job_id: str, timeout: float) -> None:
    # A subscription is not in place the moment its task starts (nor at once after a
    # failover): publish until the listener has seen one.
    deadline = time.monotonic() + timeout
    while job_id not in flights.seen:
        assert time.monotonic() < deadline, f"{job_id} never reached the listener"
        await client.publish(names.WATCH_CHANNEL, job_id)
        await asyncio.sleep(0.2)


async def test_the_worker_cancel_listener_resubscribes_on_the_new_primary(group):
    client = connect(_settings(group))
    flights = _Watched()
    listener = asyncio.create_task(CancelListener(client, flights).run())
    try:
        await _published_until_seen(client, flights, "before", 10)
        _fail_over(group)
        await _published_until_seen(client, flights, "after", 30)
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
        await client.aclose()
