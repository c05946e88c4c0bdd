"""Fixtures for the blob store tests: a real S3 server (moto's) in a process of its own, which a
test may kill and start again on the same port, and a store of each backend."""

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from services.devstack import s3_server as devstack_s3

S3_KEY_ID = "testing"
S3_SECRET = "testing"


class S3Server(devstack_s3.S3Server):
    """moto's S3 server (services/devstack/s3_server.py), with buckets made for a test."""

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
    from shared.blobstore.s3_config import S3Config

    options = {"bucket": f"fm-{uuid.uuid4().hex[:16]}", "create_bucket": True,
               "timeout": 2.0, "max_attempts": 2,
               "max_connections": 4, **kwargs}
    return S3BlobStore(S3Config(endpoint_url=server.url, region="us-east-1",
                                access_key_id=S3_KEY_ID, secret_access_key=S3_SECRET, **options))


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
