"""A worker writes each image straight to the blob store under its own key, waits out a store
that is away for a while, and past that fails the sub-request with the store's name."""

import asyncio
import time

import pytest

from services.worker.outputs import OutputWriter
from shared.blobstore.local import LocalBlobStore
from shared.errors import BlobStoreUnavailable

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))


async def test_the_output_goes_under_the_sub_requests_own_key(tmp_path):
    store = LocalBlobStore(tmp_path / "blobs")
    writer = OutputWriter(store, outage_seconds=5)
    key = await writer.write("j1", 3, PNG)
    assert key == "outputs/j1/3.png"
    assert (tmp_path / "blobs" / "outputs" / "j1" / "3.png").read_bytes() == PNG
    # A second run of the same sub-request writes the same key: one object, never two.
    assert await writer.write("j1", 3, PNG) == key
    assert [k async for k in store.keys("outputs/j1/")] == [key]


async def test_a_store_back_within_the_outage_gets_the_output(tmp_path):
    mount = tmp_path / "volume"
    mount.write_text("not mounted yet")  # a volume that is not there: every write fails
    writer = OutputWriter(LocalBlobStore(mount / "blobs"), outage_seconds=30)

    async def mount_it():
        await asyncio.sleep(1.5)
        mount.unlink()
        mount.mkdir()

    fixed = asyncio.create_task(mount_it())
    key = await writer.write("j1", 0, PNG)
    await fixed
    assert (mount / "blobs" / key).read_bytes() == PNG


async def test_a_store_away_past_the_outage_fails_naming_the_store(tmp_path):
    mount = tmp_path / "volume"
    mount.write_text("never mounted")
    writer = OutputWriter(LocalBlobStore(mount / "blobs"), outage_seconds=1.0)
    t0 = time.monotonic()
    with pytest.raises(BlobStoreUnavailable, match=str(mount / "blobs")):
        await writer.write("j1", 0, PNG)
    assert time.monotonic() - t0 < 5
