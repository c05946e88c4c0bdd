"""A worker writes each image straight to the blob store under its own key, waits out a store
that is away for a while, and past that fails the sub-request with the store's name."""

import asyncio
import time

import pytest

from services.worker.outputs import OutputWriter
from shared.blobstore.local import LocalBlobStore
from shared.errors import BlobStoreUnavailable
from shared.job_ids import new_job_id
from shared.messages import ImageItem, SubRequest

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
MADE = 1796205011.0  # 2026-12-02 09:50:11 UTC


def _sub(index: int = 0, owner: str | None = "k1", job_id: str | None = None) -> SubRequest:
    return SubRequest(job_id=job_id or new_job_id(MADE), index=index, model="digits",
                      owner=owner, item=ImageItem(prompt="3", width=16, height=16, steps=10,
                                                  guidance_scale=2.0, seed=1))


async def test_the_output_goes_under_the_sub_requests_own_key(tmp_path):
    store = LocalBlobStore(tmp_path / "blobs")
    writer = OutputWriter(store, outage_seconds=5)
    sub = _sub(3)
    key = await writer.write(sub, PNG)
    # Filed under the hour its job was made and its owner, so the sweeper can drop a whole
    # hour and the API can serve the owner after the job's record expired.
    assert key == f"outputs/2026120209/k1/{sub.job_id}/3.png"
    assert (tmp_path / "blobs" / key).read_bytes() == PNG
    # A second run of the same sub-request writes the same key: one object, never two.
    assert await writer.write(sub, PNG) == key
    assert [k async for k in store.keys("outputs/")] == [key]


async def test_an_open_api_files_outputs_under_no_owner_and_an_undated_id_under_now(tmp_path):
    writer = OutputWriter(LocalBlobStore(tmp_path / "blobs"), outage_seconds=5)
    key = await writer.write(_sub(owner=None, job_id="job1"), PNG)
    hour = time.strftime("%Y%m%d%H", time.gmtime())
    assert key in (f"outputs/{hour}/_/job1/0.png",
                   f"outputs/{time.strftime('%Y%m%d%H', time.gmtime())}/_/job1/0.png")


async def test_a_store_back_within_the_outage_gets_the_output(tmp_path):
    mount = tmp_path / "volume"
    mount.write_text("not mounted yet")  # a volume that is not there: every write fails
    writer = OutputWriter(LocalBlobStore(mount / "blobs"), outage_seconds=30)

    async def mount_it():
        await asyncio.sleep(1.5)
        mount.unlink()
        mount.mkdir()

    fixed = asyncio.create_task(mount_it())
    key = await writer.write(_sub(), PNG)
    await fixed
    assert (mount / "blobs" / key).read_bytes() == PNG


async def test_a_store_away_past_the_outage_fails_naming_the_store(tmp_path):
    mount = tmp_path / "volume"
    mount.write_text("never mounted")
    writer = OutputWriter(LocalBlobStore(mount / "blobs"), outage_seconds=1.0)
    t0 = time.monotonic()
    with pytest.raises(BlobStoreUnavailable, match=str(mount / "blobs")):
        await writer.write(_sub(), PNG)
    assert time.monotonic() - t0 < 5
