"""An object opened for reading: its type and size at once, its bytes as they arrive."""

from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType

from shared.blobstore import metrics

CHUNK_SIZE = 256 * 1024


class Blob:
    """What `BlobStore.open` returns: `content_type` and `size` (bytes), and the bytes as an
    async iterator of chunks (`async for chunk in blob`), read from the store as the consumer
    asks, never whole. Iterate it once. Reading to the end closes it; a consumer that may stop
    early (a client that disconnects) closes it with `async with blob:` or `await
    blob.aclose()`, which frees the file or the connection."""

    def __init__(self, key: str, content_type: str, size: int, chunks: AsyncIterator[bytes],
                 close: Callable[[], Awaitable[None]], *, backend: str) -> None:
        self.key = key
        self.content_type = content_type
        self.size = size
        self._chunks = chunks
        self._close = close
        self._backend = backend
        self._iterated = False
        self._closed = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        if self._iterated:
            raise RuntimeError(f"blob {self.key} is read once: open it again")
        self._iterated = True
        return self._stream()

    async def _stream(self) -> AsyncIterator[bytes]:
        read = metrics.READ_BYTES.labels(self._backend)
        try:
            async for chunk in self._chunks:
                read.inc(len(chunk))
                yield chunk
        except Exception:
            metrics.FAILURES.labels(self._backend, "read").inc()
            raise
        finally:
            await self.aclose()

    async def read(self) -> bytes:
        """Every byte at once: for small objects and tests; stream the others."""
        return b"".join([chunk async for chunk in self])

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._close()

    async def __aenter__(self) -> "Blob":
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()
