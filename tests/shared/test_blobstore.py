"""The blob store (shared/blobstore): the same behaviour from the local-filesystem backend and
the S3 backend, the latter against a real S3 server (moto's) in a process of its own."""

import asyncio
import gc
import os
import re
import signal
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client import REGISTRY
from pydantic import ValidationError

from shared.blobstore.base import BlobStore
from shared.blobstore.blob import CHUNK_SIZE
from shared.blobstore.factory import open_store
from shared.blobstore.keys import check_key, output_key
from shared.blobstore.local import LocalBlobStore
from shared.blobstore.s3 import S3BlobStore
from shared.errors import (
    BlobNotFound,
    BlobStoreUnavailable,
    InvalidBlobKey,
    OutputNotFound,
    ServiceUnavailable,
)
from shared.job_ids import new_job_id
from shared.settings import Settings

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
MADE = 1796205011.0  # 2026-12-02 09:50:11 UTC


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def listed(store: BlobStore, prefix: str = "") -> list[str]:
    return sorted([key async for key in store.keys(prefix)])


async def test_round_trip(blob_store):
    key = output_key("job1", 0, "k1")
    await blob_store.put(key, PNG, "image/png")

    blob = await blob_store.open(key)
    assert (blob.content_type, blob.size) == ("image/png", len(PNG))
    assert await blob.read() == PNG


async def test_content_type_defaults_to_the_key_suffix(blob_store):
    await blob_store.put("files/a.json", b"{}")
    await blob_store.put("files/b.bin", b"\0")
    async with await blob_store.open("files/a.json") as blob:
        assert blob.content_type == "application/json"
    async with await blob_store.open("files/b.bin") as blob:
        assert blob.content_type == "application/octet-stream"


async def test_large_object_is_streamed_in_chunks(blob_store):
    data = os.urandom(5 * 1024 * 1024)
    await blob_store.put("outputs/big/0.bin", data)

    async with await blob_store.open("outputs/big/0.bin") as blob:
        assert blob.size == len(data)
        chunks = [chunk async for chunk in blob]
    assert len(chunks) >= len(data) // CHUNK_SIZE
    assert max(len(c) for c in chunks) <= CHUNK_SIZE
    assert b"".join(chunks) == data


async def test_a_blob_closed_early_frees_its_file_or_connection(blob_store):
    """Readers that stop after one chunk (clients that disconnect) and close the blob give back
    what they held: more of them than the S3 store's connection pool (4 in these tests) still
    leaves the store answering, and no file is left open (an unclosed one fails the test:
    warnings are errors)."""
    await blob_store.put("outputs/big/0.bin", os.urandom(4 * CHUNK_SIZE))
    async with asyncio.timeout(20):
        for _ in range(8):
            blob = await blob_store.open("outputs/big/0.bin")
            assert 0 < len(await anext(aiter(blob))) <= CHUNK_SIZE
            await blob.aclose()
        await blob_store.put("outputs/j/0.png", PNG)
        async with await blob_store.open("outputs/j/0.png") as blob:
            assert await blob.read() == PNG
    gc.collect()


async def test_a_blob_is_read_once(blob_store):
    await blob_store.put("outputs/j/0.png", PNG)
    blob = await blob_store.open("outputs/j/0.png")
    assert await blob.read() == PNG
    with pytest.raises(RuntimeError, match="read once"):
        await blob.read()


async def test_overwrite_of_the_same_key_keeps_one_object(blob_store):
    """A sub-request that runs twice writes its output under the same key: the second write
    replaces the first, and there is still one object."""
    job = new_job_id(MADE)
    key = output_key(job, 3, "k1")
    assert key == output_key(job, 3, "k1") == f"outputs/2026120209/k1/{job}/3.png"
    await blob_store.put(key, b"first attempt")
    await blob_store.put(key, b"second")

    assert await (await blob_store.open(key)).read() == b"second"
    assert await listed(blob_store, "outputs/") == [key]


async def test_delete_is_idempotent(blob_store):
    keys = [f"outputs/job3/{i}.png" for i in range(3)]
    for key in keys:
        await blob_store.put(key, PNG)
    await blob_store.put("outputs/other/0.png", PNG)

    await blob_store.delete([*keys[:2], "outputs/job3/99.png"])  # one was never written
    await blob_store.delete(keys[:2])  # again
    await blob_store.delete([])

    assert await listed(blob_store) == ["outputs/job3/2.png", "outputs/other/0.png"]
    for key in keys[:2]:
        with pytest.raises(BlobNotFound):
            await blob_store.open(key)
    with pytest.raises(TypeError):
        await blob_store.delete("outputs/job3/2.png")  # one key, not a list of keys


async def test_a_file_is_stored_from_its_start_a_part_at_a_time(blob_store, monkeypatch):
    """put_file reads a file object from its start whatever its position; on S3 a file larger
    than a part goes up as a multipart upload (parts shrunk here to S3's smallest, 5 MiB)."""
    import tempfile

    from shared.blobstore import s3

    monkeypatch.setattr(s3, "PART_BYTES", 5 * 1024 * 1024)
    big, small = os.urandom(11 * 1024 * 1024 + 5), b"a small file\n"
    for key, data in (("files/big.bin", big), ("files/small.jsonl", small)):
        with tempfile.TemporaryFile() as f:
            f.write(data)  # left at its end
            await blob_store.put_file(key, f)
        async with await blob_store.open(key) as blob:
            assert blob.size == len(data)
            assert await blob.read() == data


async def test_a_byte_range_is_read_without_the_rest(blob_store):
    data = bytes(range(256)) * 40
    await blob_store.put("files/r.bin", data)
    assert await blob_store.read_range("files/r.bin", 10, 300) == data[10:300]
    assert await blob_store.read_range("files/r.bin", 0, 1) == data[:1]
    assert await blob_store.read_range("files/r.bin", 5, 5) == b""
    assert await blob_store.read_range("files/r.bin", len(data) - 3, len(data) + 50) == data[-3:]
    assert await blob_store.read_range("files/r.bin", len(data) + 1, len(data) + 9) == b""
    with pytest.raises(BlobNotFound):
        await blob_store.read_range("files/none.bin", 0, 10)
    with pytest.raises(ValueError):
        await blob_store.read_range("files/r.bin", 9, 3)


async def test_copy_makes_a_second_object_and_leaves_the_first(blob_store):
    await blob_store.put("files/a.jsonl", PNG)
    await blob_store.put("files/b.jsonl", b"replaced by the copy")
    await blob_store.copy("files/a.jsonl", "files/b.jsonl")
    await blob_store.copy("files/a.jsonl", "files/c/d.jsonl")
    for key in ("files/a.jsonl", "files/b.jsonl", "files/c/d.jsonl"):
        assert await (await blob_store.open(key)).read() == PNG
    with pytest.raises(BlobNotFound) as caught:
        await blob_store.copy("files/none.jsonl", "files/e.jsonl")
    assert caught.value.key == "files/none.jsonl"
    assert await listed(blob_store, "files/") == ["files/a.jsonl", "files/b.jsonl",
                                                  "files/c/d.jsonl"]


async def test_missing_key_raises_blob_not_found(blob_store):
    with pytest.raises(BlobNotFound) as caught:
        await blob_store.open("outputs/nojob/0.png")
    assert caught.value.key == "outputs/nojob/0.png"
    assert isinstance(caught.value, OutputNotFound)  # the API answers 404


async def test_keys_by_prefix(blob_store):
    keys = ["outputs/a/0.png", "outputs/a/1.png", "outputs/ab/0.png", "outputs/b/0.png",
            "uploads/x.bin"]
    for key in keys:
        await blob_store.put(key, b"x")

    assert await listed(blob_store) == sorted(keys)
    assert await listed(blob_store, "outputs/a/") == ["outputs/a/0.png", "outputs/a/1.png"]
    assert await listed(blob_store, "outputs/a") == [
        "outputs/a/0.png", "outputs/a/1.png", "outputs/ab/0.png"]
    assert await listed(blob_store, "outputs/a/1") == ["outputs/a/1.png"]
    assert await listed(blob_store, "nothing/") == []


async def test_folders_lists_the_folders_right_under_a_prefix(blob_store):
    for key in ["outputs/2026120209/_/j/0.png", "outputs/2026120210/k/j/0.png",
                "outputs/2026120210/k/j/1.png", "outputs/top.png", "files/f.jsonl"]:
        await blob_store.put(key, b"x")

    assert await blob_store.folders("outputs/") == ["2026120209", "2026120210"]
    assert await blob_store.folders("") == ["files", "outputs"]
    assert await blob_store.folders("outputs/2026120210/") == ["k"]
    assert await blob_store.folders("nothing/") == []
    with pytest.raises(InvalidBlobKey):
        await blob_store.folders("outputs")  # not a folder


async def test_delete_prefix_deletes_a_whole_folder_once(blob_store):
    hour = "outputs/2026120209/"
    for i in range(3):
        await blob_store.put(f"{hour}k/j{i}/0.png", PNG)
    await blob_store.put("outputs/2026120210/k/j/0.png", PNG)
    deleted = sample("fibermill_blob_deleted_bytes_total", backend=blob_store.backend)

    assert await blob_store.delete_prefix(hour) == 3
    assert await listed(blob_store) == ["outputs/2026120210/k/j/0.png"]
    assert sample("fibermill_blob_deleted_bytes_total",
                  backend=blob_store.backend) - deleted == 3 * len(PNG)
    assert await blob_store.delete_prefix(hour) == 0  # again: nothing, no error
    assert await blob_store.folders("outputs/") == ["2026120210"]


async def test_local_delete_prefix_takes_unfinished_writes_too(tmp_path):
    store = LocalBlobStore(tmp_path / "root")
    await store.put("outputs/2026120209/_/j/0.png", PNG)
    (tmp_path / "root" / "outputs" / "2026120209" / "_" / "j" / ".1.png.ab.tmp").write_bytes(b"h")

    assert await store.delete_prefix("outputs/2026120209/") == 1
    assert list((tmp_path / "root").iterdir()) == []


BAD_KEYS = ["", "/outputs/a.png", "../a.png", "outputs/../../etc/passwd", "outputs//a.png",
            "outputs/./a.png", "outputs/", ".hidden", "outputs/.a.png.123.tmp", "a\\b.png",
            "a b.png", "a\x00b", "é.png", "a" * 1025]


@pytest.mark.parametrize("key", BAD_KEYS)
async def test_invalid_keys_are_refused(blob_store, key):
    with pytest.raises(InvalidBlobKey):
        await blob_store.put(key, b"x")
    with pytest.raises(InvalidBlobKey):
        await blob_store.open(key)
    with pytest.raises(InvalidBlobKey):
        await blob_store.delete([key])
    with pytest.raises(InvalidBlobKey):
        await blob_store.url(key)
    assert await listed(blob_store) == []


@pytest.mark.parametrize("prefix", ["/", "/outputs", "../", "outputs/../", "outputs//a"])
async def test_invalid_prefixes_are_refused(blob_store, prefix):
    with pytest.raises(InvalidBlobKey):
        await listed(blob_store, prefix)


def test_valid_keys_pass_unchanged():
    for key in ["outputs/0f3c/12.png", "a", "x/y/z.tar.gz", "k=v/a-b_c+d@e~f,g.png"]:
        assert check_key(key) == key
    with pytest.raises(InvalidBlobKey):
        output_key("job", -1, None)


async def test_presigned_url_reads_the_object_with_a_plain_get(blob_store):
    await blob_store.put("outputs/j/0.png", PNG, "image/png")
    url = await blob_store.url("outputs/j/0.png", expires_seconds=60)
    if isinstance(blob_store, LocalBlobStore):
        assert url is None
        return
    assert "X-Amz-Signature=" in url
    async with httpx.AsyncClient() as client:
        answer = await client.get(url)
    assert answer.status_code == 200
    assert answer.content == PNG
    assert answer.headers["content-type"] == "image/png"


async def test_metrics_move_by_the_exact_amounts(blob_store):
    backend = blob_store.backend
    names = {
        "written": ("fibermill_blob_written_bytes_total", {}),
        "objects": ("fibermill_blob_objects_written_total", {}),
        "deleted": ("fibermill_blob_objects_deleted_total", {}),
        "read": ("fibermill_blob_read_bytes_total", {}),
        "puts": ("fibermill_blob_operation_duration_seconds_count", {"operation": "put"}),
        "opens": ("fibermill_blob_operation_duration_seconds_count", {"operation": "open"}),
        "deletes": ("fibermill_blob_operation_duration_seconds_count", {"operation": "delete"}),
        "pings": ("fibermill_blob_operation_duration_seconds_count", {"operation": "ping"}),
        **{f"failed_{op}": ("fibermill_blob_failures_total", {"operation": op})
           for op in ("put", "open", "read", "delete", "ping")},
    }

    def snapshot() -> dict[str, float]:
        return {k: sample(n, backend=backend, **ls) for k, (n, ls) in names.items()}

    before = snapshot()
    await blob_store.put("outputs/m/0.png", PNG)
    await blob_store.put("outputs/m/1.png", b"12345")
    await blob_store.put("outputs/m/1.png", b"123")  # an overwrite counts again
    assert await (await blob_store.open("outputs/m/0.png")).read() == PNG
    with pytest.raises(BlobNotFound):  # an answer, not a failure
        await blob_store.open("outputs/m/9.png")
    await blob_store.delete(["outputs/m/0.png", "outputs/m/1.png", "outputs/m/1.png"])
    await blob_store.ping()
    after = snapshot()

    moved = {k: after[k] - before[k] for k in names}
    assert moved == {
        "written": len(PNG) + 5 + 3, "objects": 3, "deleted": 2, "read": len(PNG),
        "puts": 3, "opens": 2, "deletes": 1, "pings": 1,
        "failed_put": 0, "failed_open": 0, "failed_read": 0, "failed_delete": 0,
        "failed_ping": 0,
    }


def test_every_failure_series_exists_from_the_start(tmp_path):
    LocalBlobStore(tmp_path)
    for op in ("put", "open", "read", "delete", "url", "ping", "keys"):
        assert REGISTRY.get_sample_value(
            "fibermill_blob_failures_total", {"backend": "local", "operation": op}) is not None


# Local backend only


async def test_local_reader_keeps_the_whole_old_file_across_an_overwrite(tmp_path):
    store = LocalBlobStore(tmp_path, chunk_size=1024)
    old, new = os.urandom(10_000), os.urandom(3_000)
    await store.put("outputs/j/0.png", old)

    reader = aiter(await store.open("outputs/j/0.png"))
    chunks = [await anext(reader)]  # a reader one chunk into the old file
    await store.put("outputs/j/0.png", new)
    chunks += [chunk async for chunk in reader]
    assert b"".join(chunks) == old
    assert await (await store.open("outputs/j/0.png")).read() == new


async def test_local_concurrent_writes_leave_one_whole_file_and_no_temp_files(tmp_path):
    store = LocalBlobStore(tmp_path)
    versions = [bytes([i]) * (100_000 + i) for i in range(8)]
    await asyncio.gather(*(store.put("outputs/j/0.png", v) for v in versions))

    assert await (await store.open("outputs/j/0.png")).read() in versions
    assert sorted(p.name for p in (tmp_path / "outputs" / "j").iterdir()) == ["0.png"]


async def test_local_unfinished_write_is_invisible(tmp_path):
    store = LocalBlobStore(tmp_path)
    await store.put("outputs/j/0.png", PNG)
    # What a writer killed between its temporary file and the rename leaves behind.
    (tmp_path / "outputs" / "j" / ".1.png.0123abcd.tmp").write_bytes(b"half")

    assert await listed(store) == ["outputs/j/0.png"]
    with pytest.raises(BlobNotFound):
        await store.open("outputs/j/1.png")


async def test_local_delete_removes_emptied_folders(tmp_path):
    store = LocalBlobStore(tmp_path / "root")
    await store.put("outputs/j/0.png", PNG)
    await store.put("outputs/k/0.png", PNG)
    await store.delete(["outputs/j/0.png"])

    assert not (tmp_path / "root" / "outputs" / "j").exists()
    assert (tmp_path / "root" / "outputs" / "k" / "0.png").exists()
    await store.delete(["outputs/k/0.png"])
    assert sorted(p.name for p in (tmp_path / "root").iterdir()) == []
    await store.put("outputs/j/0.png", PNG)  # folders come back as needed
    assert await listed(store) == ["outputs/j/0.png"]


async def test_local_store_that_cannot_be_used_is_unavailable(tmp_path):
    """A root that is not a folder (a PersistentVolume mounted wrong): ping and writes fail
    with BlobStoreUnavailable naming the root, counted as failures."""
    root = tmp_path / "not-a-folder"
    root.write_text("a file")
    store = LocalBlobStore(root)
    before = {op: sample("fibermill_blob_failures_total", backend="local", operation=op)
              for op in ("put", "ping")}

    with pytest.raises(BlobStoreUnavailable, match=rf"local {re.escape(str(root))}.*ping"):
        await store.ping()
    with pytest.raises(BlobStoreUnavailable, match=r"put outputs/j/0\.png") as caught:
        await store.put("outputs/j/0.png", PNG)
    assert isinstance(caught.value, ServiceUnavailable)  # the API answers 503
    for op in ("put", "ping"):
        assert sample("fibermill_blob_failures_total", backend="local",
                      operation=op) == before[op] + 1


# S3 backend only


async def test_s3_store_creates_its_bucket_only_when_asked(s3_server, make_s3_store):
    absent = make_s3_store(s3_server, create_bucket=False)
    with pytest.raises(BlobStoreUnavailable, match=r"ping failed: .*404"):
        await absent.ping()
    with pytest.raises(BlobStoreUnavailable, match=r"NoSuchBucket"):
        await absent.put("outputs/j/0.png", PNG)

    creating = make_s3_store(s3_server, bucket=absent.bucket, create_bucket=True)
    await creating.ping()
    await absent.put("outputs/j/0.png", PNG)  # the same bucket, now there
    assert await (await creating.open("outputs/j/0.png")).read() == PNG


async def test_s3_presigned_url_names_the_public_endpoint(s3_server, make_s3_store):
    store = make_s3_store(s3_server, presign_endpoint_url="https://blobs.example.com")
    url = await store.url("outputs/j/0.png", expires_seconds=300)
    assert url.startswith(f"https://blobs.example.com/{store.bucket}/outputs/j/0.png?")
    assert "X-Amz-Expires=300" in url


async def test_s3_store_down_fails_in_bounded_time_and_recovers(own_s3_server, make_s3_store):
    """SIGKILL the server: put, open and ping fail with BlobStoreUnavailable (naming the
    endpoint and the operation) within the timeouts and attempts; once a server answers on the
    same address again, the same store object works."""
    store = make_s3_store(own_s3_server, timeout=1.0, max_attempts=2)
    await store.put("outputs/j/0.png", PNG)
    assert await (await store.open("outputs/j/0.png")).read() == PNG
    failures = {op: sample("fibermill_blob_failures_total", backend="s3", operation=op)
                for op in ("put", "open", "ping")}

    own_s3_server.kill()
    for op, call in [("put", lambda: store.put("outputs/j/1.png", PNG)),
                     ("open", lambda: store.open("outputs/j/0.png")),
                     ("ping", lambda: store.ping())]:
        started = time.monotonic()
        with pytest.raises(BlobStoreUnavailable) as caught:
            await asyncio.wait_for(call(), 30)
        assert time.monotonic() - started < 5, op
        assert own_s3_server.url in str(caught.value)
        assert f"{op}" in str(caught.value)
        assert caught.value.operation == op
        assert sample("fibermill_blob_failures_total", backend="s3",
                      operation=op) == failures[op] + 1

    own_s3_server.start()
    own_s3_server.create_bucket(store.bucket)  # moto keeps nothing across a restart
    await store.ping()
    await store.put("outputs/j/0.png", b"after")
    assert await (await store.open("outputs/j/0.png")).read() == b"after"


async def test_s3_store_that_hangs_fails_in_bounded_time(own_s3_server, make_s3_store):
    """A server that accepts connections and never answers (SIGSTOP): the read timeout and the
    attempts bound a small put, and the put deadline a large one, whose body the server stops
    reading (nothing else bounds sending it)."""
    store = make_s3_store(own_s3_server, timeout=0.5, max_attempts=2,
                          min_upload_bytes_per_second=100 * 1024 * 1024)
    big = os.urandom(32 * 1024 * 1024)
    await store.ping()
    own_s3_server.proc.send_signal(signal.SIGSTOP)
    try:
        # Without the read timeout this put never ends: wait_for would raise TimeoutError
        # instead of the store's error. Two attempts of 0.5 s fit well inside 10 s.
        with pytest.raises(BlobStoreUnavailable,
                           match=r"put outputs/j/0\.png failed: .*[Tt]imeout"):
            await asyncio.wait_for(store.put("outputs/j/0.png", PNG), 10)

        started = time.monotonic()
        with pytest.raises(BlobStoreUnavailable, match=r"put outputs/j/1\.bin failed"):
            await asyncio.wait_for(store.put("outputs/j/1.bin", big), 30)
        assert time.monotonic() - started < store.put_deadline(len(big)) + 1
    finally:
        own_s3_server.proc.send_signal(signal.SIGCONT)
    await store.ping()
    # The large put's connection was given up with most of its body unsent, and a transport
    # closes only once its buffer is written out. Kill the server and let this test's loop see
    # the reset, so that the socket closes here rather than in a later test's garbage collection.
    own_s3_server.kill()
    await asyncio.sleep(0.5)


# Picking the backend


async def test_open_store_picks_the_backend_from_settings(tmp_path, s3_server):
    local = open_store(Settings(blob_dir=tmp_path / "b"))
    assert isinstance(local, LocalBlobStore)
    assert local.root == tmp_path / "b"

    s3 = open_store(Settings(
        blob_backend="s3", s3_endpoint_url=s3_server.url, s3_bucket="picked",
        s3_access_key_id="testing", s3_secret_access_key="testing", s3_create_bucket=True,
        blob_timeout_seconds=3, blob_max_attempts=2))
    assert isinstance(s3, S3BlobStore)
    async with s3:
        await s3.put("outputs/j/0.png", PNG)
        assert await (await s3.open("outputs/j/0.png")).read() == PNG
        client_config = s3._client.meta.config
        assert client_config.retries == {"mode": "standard", "total_max_attempts": 2}
        assert (client_config.connect_timeout, client_config.read_timeout) == (3, 3)
        assert client_config.s3["addressing_style"] == "path"


def test_settings_refuse_s3_without_a_bucket():
    with pytest.raises(ValidationError, match="s3_bucket"):
        Settings(blob_backend="s3")
    assert Settings().blob_backend == "local"
    assert Settings().blob_dir == Path(__file__).resolve().parents[2] / "run" / "blobs"
