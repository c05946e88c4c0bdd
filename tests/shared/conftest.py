"""Fixtures for the blob store tests: a real S3 server (moto's) in a process of its own, which a
test may kill and start again on the same port, and a store of each backend."""

import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from services.devstack.redis_server import free_port

S3_KEY_ID = "testing"
S3_SECRET = "testing"


class S3Server:
    """`python -m moto.server` on 127.0.0.1: a real S3 endpoint over HTTP, state in memory."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto.server exited with {self.proc.returncode}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"moto.server did not listen on {self.url} in {timeout}s")
            time.sleep(0.05)

    def _answers(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
        except OSError:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL: the server vanishes without closing anything itself."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def create_bucket(self, bucket: str) -> None:
        """With a plain synchronous client, not the store under test."""
        import boto3

        client = boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                              aws_access_key_id=S3_KEY_ID, aws_secret_access_key=S3_SECRET)
        try:
            client.create_bucket(Bucket=bucket)
        finally:
            client.close()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    server = S3Server()
    server.start()
    yield server
    server.kill()


@pytest.fixture
def own_s3_server() -> Iterator[S3Server]:
    """A server of this test's own, which it may kill."""
    server = S3Server()
    server.start()
    yield server
    server.kill()


def new_s3_store(server: S3Server, **kwargs):
    """An S3 store on `server`: a fresh bucket that the store creates itself, short timeouts,
    a pool of 4 connections, unless the keyword arguments say otherwise."""
    from shared.blobstore.s3 import S3BlobStore

    options = {"bucket": f"fm-{uuid.uuid4().hex[:16]}", "create_bucket": True,
               "timeout": 2.0, "max_attempts": 2,
               "max_connections": 4, **kwargs}
    return S3BlobStore(endpoint_url=server.url, region="us-east-1",
                       access_key_id=S3_KEY_ID, secret_access_key=S3_SECRET, **options)


@pytest.fixture
async def make_s3_store() -> AsyncIterator[Callable[..., object]]:
    """new_s3_store, each store closed at the end of the test."""
    made = []

    def make(server: S3Server, **kwargs):
        made.append(new_s3_store(server, **kwargs))
        return made[-1]

    yield make
    for store in made:
        await store.close()


@pytest.fixture(params=["local", "s3"])
async def blob_store(request, tmp_path: Path) -> AsyncIterator[object]:
    """A store of each backend, empty."""
    if request.param == "local":
        from shared.blobstore.local import LocalBlobStore

        store = LocalBlobStore(tmp_path / "blobs")
    else:
        store = new_s3_store(request.getfixturevalue("s3_server"))
    yield store
    await store.close()
