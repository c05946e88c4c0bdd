"""The sweeper deletes whole hours of outputs once their retention ends, and nothing else; any
number of replicas may run it at once."""

import asyncio
import time

import pytest
from prometheus_client import REGISTRY

from services.api.sweeper import Sweeper
from shared.blobstore.keys import output_key
from shared.blobstore.local import LocalBlobStore
from shared.errors import BlobStoreUnavailable
from shared.job_ids import new_job_id
from shared.redis_clock import redis_now
from shared.settings import Settings

DAY = 86400
PNG = b"\x89PNG\r\n\x1a\n" + bytes(64)


def sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def _settings() -> Settings:
    return Settings(output_ttl_seconds=7 * DAY)


async def _outputs(store: LocalBlobStore, made: float, jobs: int, owner: str | None = "k1"
                   ) -> list[str]:
    keys = [output_key(new_job_id(made), i, owner) for _ in range(jobs) for i in range(2)]
    for key in keys:
        await store.put(key, PNG)
    return keys


async def _listed(store: LocalBlobStore) -> list[str]:
    return sorted([k async for k in store.keys("")])


async def test_expired_hours_go_whole_and_kept_ones_stay(tmp_path, aredis):
    store = LocalBlobStore(tmp_path)
    now = time.time()
    old = await _outputs(store, now - 9 * DAY, 3) + await _outputs(store, now - 8 * DAY, 2, None)
    kept = await _outputs(store, now - 6 * DAY, 2) + await _outputs(store, now, 1)
    await store.put("outputs/notes/readme.txt", b"not an hour")  # not the sweeper's
    await store.put("files/batch.jsonl", b"{}")
    swept = sample("fibermill_retention_folders_swept_total")

    assert await Sweeper(store, _settings(), aredis).sweep(now) == len(old)
    assert await _listed(store) == sorted([*kept, "outputs/notes/readme.txt",
                                           "files/batch.jsonl"])
    assert sample("fibermill_retention_folders_swept_total") - swept == 2
    age = sample("fibermill_retention_oldest_output_age_seconds")
    assert 6 * DAY <= age <= 6 * DAY + 3600


async def test_a_job_that_failed_half_way_leaves_nothing_once_its_hour_expires(tmp_path, aredis):
    """Its one finished output, and a killed writer's unfinished file beside it."""
    store = LocalBlobStore(tmp_path)
    made = time.time() - 8 * DAY
    key = output_key(new_job_id(made), 0, "k1")
    await store.put(key, PNG)
    (tmp_path / key).with_name(".1.png.abcd.tmp").write_bytes(b"half")

    assert await Sweeper(store, _settings(), aredis).sweep() == 1
    assert list(tmp_path.iterdir()) == []


async def test_replicas_sweeping_at_once_all_succeed_and_agree(tmp_path, aredis):
    store = LocalBlobStore(tmp_path)
    now = time.time()
    old = await _outputs(store, now - 8 * DAY, 20)
    kept = await _outputs(store, now, 2)
    counts = await asyncio.gather(*(Sweeper(store, _settings(), aredis).sweep(now)
                                    for _ in range(3)))
    assert all(0 <= c <= len(old) for c in counts)  # no replica fails on the others' deletes
    assert await _listed(store) == sorted(kept)
    assert await Sweeper(store, _settings(), aredis).sweep(now) == 0  # and again: nothing


async def test_a_store_that_is_down_fails_the_sweep_loudly(tmp_path, aredis):
    root = tmp_path / "not-a-folder"
    root.write_text("x")
    with pytest.raises(BlobStoreUnavailable):
        await Sweeper(LocalBlobStore(root), _settings(), aredis).sweep()


async def test_the_loop_waits_out_a_store_that_is_down_and_sweeps_once_it_is_back(tmp_path, aredis):
    mount = tmp_path / "volume"
    store = LocalBlobStore(mount / "blobs")
    old = await _outputs(store, time.time() - 8 * DAY, 1)
    mount.rename(tmp_path / "away")
    mount.write_text("the volume is gone")
    sweeper = Sweeper(store, Settings(output_ttl_seconds=7 * DAY, sweep_interval_seconds=0.05),
                      aredis)
    loop = asyncio.create_task(sweeper.run())
    await asyncio.sleep(0.2)
    assert not loop.done()  # failed sweeps are put off, not fatal to the loop
    mount.unlink()
    (tmp_path / "away").rename(mount)
    deadline = time.monotonic() + 30
    while (mount / "blobs" / old[0]).exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    loop.cancel()
    assert not (mount / "blobs" / old[0]).exists()


def _hour_ending(at: float) -> float:
    """A moment in the hour that ends at `at` (an hour boundary)."""
    return at - 1800


async def test_a_fast_host_clock_does_not_sweep_an_hour_early(tmp_path, aredis, monkeypatch):
    store = LocalBlobStore(tmp_path)
    ttl = 7 * DAY
    now = await redis_now(aredis)
    # The newest hour whose retention, by Redis's clock, ends within the next hour: still kept.
    hour_end = (now - ttl) // 3600 * 3600 + 3600
    kept = await _outputs(store, _hour_ending(hour_end), 1)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)  # this replica runs an hour fast
    assert await Sweeper(store, _settings(), aredis).sweep() == 0
    assert await _listed(store) == sorted(kept)


async def test_a_slow_host_clock_still_sweeps_an_expired_hour(tmp_path, aredis, monkeypatch):
    store = LocalBlobStore(tmp_path)
    ttl = 7 * DAY
    now = await redis_now(aredis)
    # The newest hour past its retention by Redis's clock (it ended over an hour ago + ttl).
    hour_end = (now - ttl) // 3600 * 3600
    old = await _outputs(store, _hour_ending(hour_end), 1)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 3600)  # this replica runs an hour slow
    assert await Sweeper(store, _settings(), aredis).sweep() == len(old)
    assert await _listed(store) == []
