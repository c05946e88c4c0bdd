"""The S3-compatible backend (MinIO, Ceph, GCS interoperability, AWS) on aiobotocore.

One client per store, made at first use and closed by close(). Retries are botocore's own
(standard mode: backoff with jitter, a retry quota), bounded by `max_attempts` attempts in all,
each with `timeout` to connect and to read; what still fails becomes BlobStoreUnavailable,
naming the endpoint, the bucket and the operation. Path-style addressing
(`{endpoint}/{bucket}/{key}`), which MinIO and most self-hosted servers need, and checksums only
where an operation requires them (botocore's newer default, CRC trailers on every upload, is
refused by several S3-compatible servers).
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, contextmanager
from typing import Any, BinaryIO

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError
from botocore.handlers import add_expect_header

from shared.blobstore.base import BlobStore
from shared.blobstore.blob import Blob
from shared.blobstore.s3_config import S3Config
from shared.errors import BlobNotFound, BlobStoreUnavailable

DELETE_CONCURRENCY = 16
PART_BYTES = 8 * 1024 * 1024  # a multipart upload's parts (S3's smallest but the last: 5 MiB)
_TRANSPORT_ERRORS = (BotoCoreError, aiohttp.ClientError, OSError)  # OSError: TimeoutError too


def _read_at(f: BinaryIO, start: int, size: int) -> bytes:
    f.seek(start)
    return f.read(size)


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code") or "")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        message = exc.response.get("Error", {}).get("Message") or ""
        return f"{_code(exc) or 'error'} (HTTP {_status(exc)}){': ' + message if message else ''}"
    return f"{type(exc).__name__}: {exc}"


class S3BlobStore(BlobStore):
    """A bucket on an S3-compatible server; `url()` gives presigned GET URLs."""

    backend = "s3"

    def __init__(self, config: S3Config) -> None:
        super().__init__()
        if not config.bucket:
            raise ValueError("an S3 blob store needs a bucket")
        self.config = config
        self.bucket = config.bucket
        self.endpoint_url = config.endpoint_url or None
        self.presign_endpoint_url = config.presign_endpoint_url or None
        self.region = config.region
        self.create_bucket = config.create_bucket
        self.chunk_size = config.chunk_size
        self.timeout = config.timeout
        self.max_attempts = config.max_attempts
        self.min_upload_bytes_per_second = config.min_upload_bytes_per_second
        self._credentials = {"aws_access_key_id": config.access_key_id,
                             "aws_secret_access_key": config.secret_access_key}
        self._config = AioConfig(
            connect_timeout=config.timeout,
            read_timeout=config.timeout,
            max_pool_connections=config.max_connections,
            retries={"mode": "standard", "total_max_attempts": config.max_attempts},
            s3={"addressing_style": "path"},
            signature_version="s3v4",
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        self._stack = AsyncExitStack()
        self._client: Any = None
        self._presigner: Any = None
        self._bucket_ready = not config.create_bucket
        self._lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def location(self) -> str:
        return f"s3 {self.endpoint_url or 'aws:' + self.region}/{self.bucket}"

    async def _make_client(self, endpoint_url: str | None) -> Any:
        session = get_session()
        client = await self._stack.enter_async_context(session.create_client(
            "s3", endpoint_url=endpoint_url, region_name=self.region, config=self._config,
            **self._credentials))
        # No `Expect: 100-continue` on uploads: aiohttp waits for the interim answer with no
        # timeout at all, so a server that accepts the connection and hangs would hang every
        # put forever (read_timeout only starts once the body is sent).
        client.meta.events.unregister("before-call.s3", add_expect_header)
        return client

    def _check_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError(
                f"blob store {self.location} is used from another event loop than the one "
                "that opened it: make one store per event loop")

    async def _get_client(self, operation: str, key: str | None = None) -> Any:
        """The client, made on first use; with create_bucket, the bucket too (made once)."""
        self._check_loop()
        if self._client is not None and self._bucket_ready:
            return self._client
        async with self._lock:
            with self._errors(operation, key):
                if self._client is None:
                    self._client = await self._make_client(self.endpoint_url)
                if not self._bucket_ready:
                    await self._ensure_bucket(self._client)
                    self._bucket_ready = True
        return self._client

    async def _ensure_bucket(self, client: Any) -> None:
        try:
            await client.head_bucket(Bucket=self.bucket)
            return
        except ClientError as exc:
            if _status(exc) != 404:
                raise
        extra = ({} if self.region == "us-east-1" else
                 {"CreateBucketConfiguration": {"LocationConstraint": self.region}})
        try:
            await client.create_bucket(Bucket=self.bucket, **extra)
        except ClientError as exc:
            if _code(exc) != "BucketAlreadyOwnedByYou":  # another process made it just now
                raise

    @contextmanager
    def _errors(self, operation: str, key: str | None = None) -> Iterator[None]:
        """The client's errors in domain terms: a missing object is BlobNotFound (for open),
        everything else that reached here has used up its retries."""
        try:
            yield
        except ClientError as exc:
            if operation == "open" and key is not None and (
                    _code(exc) in ("NoSuchKey", "404") or _status(exc) == 404):
                raise BlobNotFound(key) from None
            raise BlobStoreUnavailable(self.location, operation, _describe(exc), key) from exc
        except _TRANSPORT_ERRORS as exc:
            raise BlobStoreUnavailable(self.location, operation, _describe(exc), key) from exc

    def put_deadline(self, size: int) -> float:
        """The longest a put of `size` bytes may take, retries included. Reads are bounded by
        the read timeout, but nothing in aiohttp bounds sending a body to a server that stopped
        reading: each attempt gets two timeouts plus the body at the slowest allowed rate, and
        one second in all for the backoff between attempts."""
        per_attempt = 2 * self.timeout + size / self.min_upload_bytes_per_second
        return self.max_attempts * per_attempt + 1.0

    async def _put(self, key: str, data: bytes, content_type: str) -> None:
        client = await self._get_client("put", key)
        deadline = self.put_deadline(len(data))
        try:
            async with asyncio.timeout(deadline):
                with self._errors("put", key):
                    await client.put_object(Bucket=self.bucket, Key=key, Body=data,
                                            ContentType=content_type)
        except TimeoutError as exc:
            raise BlobStoreUnavailable(
                self.location, "put", f"not done in {deadline:.1f}s (the upload stalled)", key,
            ) from exc

    async def _put_file(self, key: str, f: BinaryIO, size: int, content_type: str) -> None:
        if size <= PART_BYTES:
            await self._put(key, await asyncio.to_thread(_read_at, f, 0, size), content_type)
            return
        # A part at a time (multipart upload): one part is in memory, never the whole file.
        client = await self._get_client("put", key)
        with self._errors("put", key):
            upload = await client.create_multipart_upload(Bucket=self.bucket, Key=key,
                                                          ContentType=content_type)
        upload_id = upload["UploadId"]
        try:
            parts = []
            for number, start in enumerate(range(0, size, PART_BYTES), start=1):
                data = await asyncio.to_thread(_read_at, f, start, PART_BYTES)
                deadline = self.put_deadline(len(data))
                try:
                    async with asyncio.timeout(deadline):
                        with self._errors("put", key):
                            part = await client.upload_part(
                                Bucket=self.bucket, Key=key, UploadId=upload_id,
                                PartNumber=number, Body=data)
                except TimeoutError as exc:
                    raise BlobStoreUnavailable(
                        self.location, "put", f"a part not done in {deadline:.1f}s", key,
                    ) from exc
                parts.append({"PartNumber": number, "ETag": part["ETag"]})
            with self._errors("put", key):
                await client.complete_multipart_upload(
                    Bucket=self.bucket, Key=key, UploadId=upload_id,
                    MultipartUpload={"Parts": parts})
        except BaseException:
            with contextlib.suppress(Exception):
                await client.abort_multipart_upload(Bucket=self.bucket, Key=key,
                                                    UploadId=upload_id)
            raise

    async def _read_range(self, key: str, start: int, end: int) -> bytes:
        client = await self._get_client("open", key)
        with self._errors("open", key):
            try:
                response = await client.get_object(Bucket=self.bucket, Key=key,
                                                   Range=f"bytes={start}-{end - 1}")
            except ClientError as exc:
                if _code(exc) == "InvalidRange":  # starts past the end: nothing there
                    return b""
                raise
        body = response["Body"]
        try:
            with self._errors("read", key):
                return bytes(await body.read())
        finally:
            body.close()

    async def _copy(self, source: str, key: str) -> None:
        client = await self._get_client("copy", key)
        with self._errors("copy", key):
            try:
                await client.copy_object(Bucket=self.bucket, Key=key,
                                         CopySource={"Bucket": self.bucket, "Key": source})
            except ClientError as exc:
                if _code(exc) in ("NoSuchKey", "404") or _status(exc) == 404:
                    raise BlobNotFound(source) from None
                raise

    async def _open(self, key: str) -> Blob:
        client = await self._get_client("open", key)
        with self._errors("open", key):
            response = await client.get_object(Bucket=self.bucket, Key=key)
        body = response["Body"]

        async def chunks() -> AsyncIterator[bytes]:
            with self._errors("read", key):
                async for chunk in body.iter_chunks(self.chunk_size):
                    yield chunk

        async def close() -> None:
            body.close()

        return Blob(key, response.get("ContentType") or "application/octet-stream",
                    int(response["ContentLength"]), chunks(), close, backend=self.backend)

    async def _delete(self, keys: list[str]) -> None:
        # One DeleteObject per key (a few at a time), not DeleteObjects: GCS's interoperability
        # API has no multi-object delete. Deleting a missing key succeeds.
        client = await self._get_client("delete")
        limit = asyncio.Semaphore(DELETE_CONCURRENCY)

        async def delete_one(key: str) -> None:
            async with limit:
                with self._errors("delete", key):
                    await client.delete_object(Bucket=self.bucket, Key=key)

        results = await asyncio.gather(*(delete_one(k) for k in keys), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _url(self, key: str, expires_seconds: int) -> str | None:
        presigner = await self._get_presigner(key)
        with self._errors("url", key):
            return await presigner.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": key},
                ExpiresIn=expires_seconds)

    async def _get_presigner(self, key: str) -> Any:
        """The client that signs URLs: the main one, or one for presign_endpoint_url. Signing
        needs no network, so neither the store nor the bucket is checked."""
        self._check_loop()
        if self._presigner is None:
            async with self._lock:
                if self._presigner is None:
                    with self._errors("url", key):
                        if self.presign_endpoint_url:
                            self._presigner = await self._make_client(self.presign_endpoint_url)
                        else:
                            if self._client is None:
                                self._client = await self._make_client(self.endpoint_url)
                            self._presigner = self._client
        return self._presigner

    async def _ping(self) -> None:
        client = await self._get_client("ping")
        with self._errors("ping"):
            await client.head_bucket(Bucket=self.bucket)

    async def _keys(self, prefix: str) -> AsyncIterator[str]:
        client = await self._get_client("keys")
        paginator = client.get_paginator("list_objects_v2")
        with self._errors("keys"):
            async for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                for item in page.get("Contents", ()):
                    yield item["Key"]

    async def _folders(self, prefix: str) -> list[str]:
        client = await self._get_client("folders")
        paginator = client.get_paginator("list_objects_v2")
        names = []
        with self._errors("folders"):
            async for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix,
                                                 Delimiter="/"):
                for common in page.get("CommonPrefixes", ()):
                    names.append(common["Prefix"][len(prefix):].rstrip("/"))
        return names

    async def _delete_prefix(self, prefix: str) -> tuple[int, int]:
        # Listed and deleted a page (up to 1000 keys) at a time, so memory stays flat however
        # many objects the folder holds.
        client = await self._get_client("keys")
        paginator = client.get_paginator("list_objects_v2")
        objects = size = 0
        with self._errors("keys"):
            async for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                contents = page.get("Contents", ())
                await self._delete([item["Key"] for item in contents])
                objects += len(contents)
                size += sum(item["Size"] for item in contents)
        return objects, size

    async def close(self) -> None:
        async with self._lock:
            self._client = self._presigner = None
            self._bucket_ready = not self.create_bucket
            stack, self._stack = self._stack, AsyncExitStack()
            await stack.aclose()
            # aiohttp closes its connections' transports on the next loop pass; without one,
            # a loop that ends now leaves them "closing", reported unclosed when collected.
            await asyncio.sleep(0)
        # Free to be used again, from any event loop.
        self._lock = asyncio.Lock()
        self._loop = None
