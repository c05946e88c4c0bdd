"""The one interface of the blob store, with key checks and metrics in one place: a backend
implements the underscored methods and counts nothing itself."""

import asyncio
import mimetypes
import os
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import BinaryIO, ClassVar

from shared.blobstore import metrics
from shared.blobstore.blob import Blob
from shared.blobstore.keys import check_key, check_prefix
from shared.errors import BlobNotFound, InvalidBlobKey

DEFAULT_CONTENT_TYPE = "application/octet-stream"


def content_type_of(key: str) -> str:
    """The content type a key's suffix names (`.png`: image/png), else octet-stream."""
    return mimetypes.guess_type(key, strict=False)[0] or DEFAULT_CONTENT_TYPE


class BlobStore(ABC):
    """Objects (bytes with a content type) under `/`-separated keys (shared/blobstore/keys.py).

    Errors: a missing key is BlobNotFound; a key that is not valid is InvalidBlobKey; a store
    that cannot be reached or refuses, after the client's retries, is BlobStoreUnavailable (it
    names the store and the operation). Use a store from the event loop that first used it, and
    close it (`close()` or `async with`) when done."""

    backend: ClassVar[str]

    def __init__(self) -> None:
        metrics.export(self.backend)

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the objects are, for messages: a folder, or an endpoint and bucket."""

    async def put(self, key: str, data: bytes, content_type: str | None = None) -> None:
        """Store `data` under `key`, replacing what was there: writing the same key again with
        the same bytes changes nothing, so a retried writer is harmless. A reader sees the
        old object or the new one, never part of one. `content_type` defaults to what the
        key's suffix names."""
        check_key(key)
        data = bytes(data)
        with self._measured("put"):
            await self._put(key, data, content_type or content_type_of(key))
        metrics.WRITTEN_BYTES.labels(self.backend).inc(len(data))
        metrics.OBJECTS_WRITTEN.labels(self.backend).inc()

    async def put_file(self, key: str, f: BinaryIO, content_type: str | None = None) -> None:
        """Store the whole of a seekable file (from its start, whatever its position) under
        `key`, as put does, read a chunk at a time: a large upload is never in memory whole."""
        check_key(key)
        size = await asyncio.to_thread(_size_of, f)
        with self._measured("put"):
            await self._put_file(key, f, size, content_type or content_type_of(key))
        metrics.WRITTEN_BYTES.labels(self.backend).inc(size)
        metrics.OBJECTS_WRITTEN.labels(self.backend).inc()

    async def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes `start` to `end` (excluded) of the object, fewer when it ends before `end`:
        a part of a large object without reading the rest. BlobNotFound when there is none."""
        check_key(key)
        if not 0 <= start <= end:
            raise ValueError(f"not a byte range: {start} to {end}")
        if start == end:
            return b""
        with self._measured("read"):
            data = await self._read_range(key, start, end)
        metrics.READ_BYTES.labels(self.backend).inc(len(data))
        return data

    async def copy(self, source: str, key: str) -> None:
        """Store a copy of the object under `source` under `key` (replacing what was there),
        without its bytes passing through this process where the backend can (S3 copies on
        the server). BlobNotFound when `source` has no object."""
        check_key(source)
        check_key(key)
        with self._measured("copy"):
            await self._copy(source, key)
        metrics.OBJECTS_WRITTEN.labels(self.backend).inc()

    async def open(self, key: str) -> Blob:
        """The object under `key`, to stream (see Blob); BlobNotFound when there is none."""
        check_key(key)
        with self._measured("open"):
            return await self._open(key)

    async def delete(self, keys: Iterable[str]) -> None:
        """Delete these keys; one that does not exist is not an error."""
        if isinstance(keys, str):
            raise TypeError("delete takes a list of keys, not one key")
        unique = list(dict.fromkeys(check_key(k) for k in keys))
        if not unique:
            return
        with self._measured("delete"):
            await self._delete(unique)
        metrics.OBJECTS_DELETED.labels(self.backend).inc(len(unique))

    async def url(self, key: str, expires_seconds: int = 900) -> str | None:
        """A URL that reads the object with a plain GET for `expires_seconds`, without
        credentials (a presigned URL), or None when the backend has none (local). It does not
        check that the object exists."""
        check_key(key)
        if expires_seconds < 1:
            raise ValueError("expires_seconds must be at least 1")
        with self._measured("url"):
            return await self._url(key, expires_seconds)

    async def ping(self) -> None:
        """Returns when the store answers; BlobStoreUnavailable when it does not (/readyz)."""
        with self._measured("ping"):
            await self._ping()

    async def keys(self, prefix: str = "") -> AsyncIterator[str]:
        """Every key that starts with `prefix`, in no promised order, fetched as the consumer
        iterates (a sweeper that looks for orphans)."""
        check_prefix(prefix)
        try:
            async for key in self._keys(prefix):
                yield key
        except Exception:
            metrics.FAILURES.labels(self.backend, "keys").inc()
            raise

    async def folders(self, prefix: str) -> list[str]:
        """The names of the folders right under `prefix` (a folder, ending in `/`), sorted:
        `outputs/` lists its hours. One listing call on S3 for up to 1000 of them."""
        check_prefix(prefix)
        if prefix and not prefix.endswith("/"):
            raise InvalidBlobKey(prefix, "a folder ends with /")
        with self._measured("folders"):
            return sorted(await self._folders(prefix))

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every object under a folder (`outputs/2026120209/`), and on a local store
        the unfinished writes in it too; returns how many objects there were. Running it again,
        or on a folder that is gone, deletes nothing and is not an error."""
        check_prefix(prefix)
        if not prefix.endswith("/"):
            raise InvalidBlobKey(prefix, "a folder ends with /")
        with self._measured("delete"):
            objects, size = await self._delete_prefix(prefix)
        metrics.OBJECTS_DELETED.labels(self.backend).inc(objects)
        metrics.DELETED_BYTES.labels(self.backend).inc(size)
        return objects

    @abstractmethod
    async def close(self) -> None:
        """Free connections; a store used again after close opens new ones."""

    async def __aenter__(self) -> "BlobStore":
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    @contextmanager
    def _measured(self, operation: str) -> Iterator[None]:
        """Time the operation; count it as failed unless it ended with an answer (a missing key
        or a bad key is an answer). A cancelled operation is neither timed nor counted."""
        start = time.perf_counter()
        try:
            yield
        except (BlobNotFound, InvalidBlobKey):
            self._observe(operation, start)
            raise
        except Exception:
            metrics.FAILURES.labels(self.backend, operation).inc()
            self._observe(operation, start)
            raise
        self._observe(operation, start)

    def _observe(self, operation: str, start: float) -> None:
        metrics.OPERATION_SECONDS.labels(self.backend, operation).observe(
            time.perf_counter() - start)

    @abstractmethod
    async def _put(self, key: str, data: bytes, content_type: str) -> None: ...

    @abstractmethod
    async def _put_file(self, key: str, f: BinaryIO, size: int, content_type: str) -> None: ...

    @abstractmethod
    async def _read_range(self, key: str, start: int, end: int) -> bytes: ...

    @abstractmethod
    async def _copy(self, source: str, key: str) -> None: ...

    @abstractmethod
    async def _open(self, key: str) -> Blob: ...

    @abstractmethod
    async def _delete(self, keys: list[str]) -> None: ...

    @abstractmethod
    async def _url(self, key: str, expires_seconds: int) -> str | None: ...

    @abstractmethod
    async def _folders(self, prefix: str) -> list[str]: ...

    @abstractmethod
    async def _delete_prefix(self, prefix: str) -> tuple[int, int]:
        """(objects, bytes) deleted."""

    @abstractmethod
    async def _ping(self) -> None: ...

    @abstractmethod
    def _keys(self, prefix: str) -> AsyncIterator[str]: ...


def _size_of(f: BinaryIO) -> int:
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(0)
    return size
