"""The local-filesystem backend: one file per key under a root folder (`make run`, and in
deploy/k8s a PersistentVolume that the API and every worker mount). File IO runs in threads,
off the event loop."""

import asyncio
import contextlib
import errno
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import BinaryIO

from shared.blobstore.base import BlobStore, content_type_of
from shared.blobstore.blob import CHUNK_SIZE, Blob
from shared.errors import BlobNotFound, BlobStoreUnavailable

TEMP_SUFFIX = ".tmp"  # unfinished writes: `.{name}.{random}.tmp`, beside their target


class LocalBlobStore(BlobStore):
    """Writes go to a hidden temporary file in the target's folder, are flushed to disk and
    then renamed over the target (os.replace, atomic on one filesystem): a reader sees the old
    file or the new one, whole, and a reader that opened the old one keeps reading it whole.
    A writer killed mid-write leaves a hidden `.tmp` file that no listing or read sees.
    The content type is not stored: it is the key's suffix's (`.png`: image/png)."""

    backend = "local"

    def __init__(self, root: Path | str, *, ping_timeout: float = 10.0,
                 chunk_size: int = CHUNK_SIZE) -> None:
        super().__init__()
        self.root = Path(root).absolute()
        self.ping_timeout = ping_timeout
        self.chunk_size = chunk_size
        # Created now so that a fresh install pings ready; ping says when this failed.
        with contextlib.suppress(OSError):
            self.root.mkdir(parents=True, exist_ok=True)

    @property
    def location(self) -> str:
        return f"local {self.root}"

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*key.split("/"))

    def _unavailable(self, operation: str, exc: OSError, key: str | None = None
                     ) -> BlobStoreUnavailable:
        detail = f"{type(exc).__name__}: {exc.strerror or exc}"
        return BlobStoreUnavailable(self.location, operation, detail, key)

    async def _put(self, key: str, data: bytes, content_type: str) -> None:
        try:
            await asyncio.to_thread(self._write, self._path(key), lambda out: out.write(data))
        except OSError as exc:
            raise self._unavailable("put", exc, key) from exc

    async def _put_file(self, key: str, f: BinaryIO, size: int, content_type: str) -> None:
        def fill(out: BinaryIO) -> None:
            f.seek(0)
            shutil.copyfileobj(f, out, self.chunk_size)

        try:
            await asyncio.to_thread(self._write, self._path(key), fill)
        except OSError as exc:
            raise self._unavailable("put", exc, key) from exc

    async def _copy(self, source: str, key: str) -> None:
        try:
            f, size = await asyncio.to_thread(self._open_file, self._path(source))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise BlobNotFound(source) from None
        except OSError as exc:
            raise self._unavailable("copy", exc, source) from exc
        try:
            await self._put_file(key, f, size, content_type_of(key))
        finally:
            f.close()

    async def _read_range(self, key: str, start: int, end: int) -> bytes:
        def read() -> bytes:
            with open(self._path(key), "rb") as f:
                f.seek(start)
                return f.read(end - start)

        try:
            return await asyncio.to_thread(read)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise BlobNotFound(key) from None
        except OSError as exc:
            raise self._unavailable("read", exc, key) from exc

    @staticmethod
    def _write(path: Path, fill: Callable[[BinaryIO], object]) -> None:
        for attempt in range(3):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}{TEMP_SUFFIX}"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileNotFoundError:
                if attempt == 2:
                    raise
                continue  # a delete removed the emptied folder in between: make it again
            try:
                with os.fdopen(fd, "wb") as f:
                    fill(f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except FileNotFoundError:
                if attempt == 2:
                    raise
                continue  # the folder was deleted (a sweep) under the write: write it again
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            return

    async def _open(self, key: str) -> Blob:
        try:
            f, size = await asyncio.to_thread(self._open_file, self._path(key))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise BlobNotFound(key) from None
        except OSError as exc:
            raise self._unavailable("open", exc, key) from exc

        async def chunks() -> AsyncIterator[bytes]:
            while True:
                try:
                    chunk = await asyncio.to_thread(f.read, self.chunk_size)
                except OSError as exc:
                    raise self._unavailable("read", exc, key) from exc
                if not chunk:
                    return
                yield chunk

        async def close() -> None:
            f.close()

        return Blob(key, content_type_of(key), size, chunks(), close, backend=self.backend)

    @staticmethod
    def _open_file(path: Path) -> tuple[BinaryIO, int]:
        f = open(path, "rb")  # noqa: SIM115  (closed by the Blob)
        try:
            size = os.fstat(f.fileno()).st_size
        except BaseException:
            f.close()
            raise
        return f, size

    async def _delete(self, keys: list[str]) -> None:
        try:
            await asyncio.to_thread(self._remove, [self._path(k) for k in keys])
        except OSError as exc:
            raise self._unavailable("delete", exc) from exc

    def _remove(self, paths: list[Path]) -> None:
        folders: set[Path] = set()
        for path in paths:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError, NotADirectoryError):
                path.unlink()
            folders.add(path.parent)
        # Folders left empty (a job's outputs/{id}/) go too, up to the root.
        for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
            while folder != self.root and self.root in folder.parents:
                try:
                    folder.rmdir()
                except OSError as exc:
                    if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                        break
                    raise
                folder = folder.parent

    async def _folders(self, prefix: str) -> list[str]:
        try:
            # A root that is gone is a store that is down, not a store with nothing in it.
            await asyncio.to_thread(self._check_root)
            entries = await asyncio.to_thread(self._scan, prefix.rstrip("/"))
        except OSError as exc:
            raise self._unavailable("folders", exc) from exc
        return [name for name, is_dir in entries if is_dir and not name.startswith(".")]

    async def _delete_prefix(self, prefix: str) -> tuple[int, int]:
        try:
            return await asyncio.to_thread(self._remove_tree, self._path(prefix.rstrip("/")))
        except OSError as exc:
            raise self._unavailable("delete", exc) from exc

    def _remove_tree(self, folder: Path) -> tuple[int, int]:
        objects = size = 0
        if not folder.is_dir():
            return 0, 0
        for parent, _dirs, files in os.walk(folder):
            for name in files:
                if not name.startswith("."):
                    objects += 1
                    with contextlib.suppress(FileNotFoundError):
                        size += os.stat(os.path.join(parent, name)).st_size
        shutil.rmtree(folder, onerror=_gone_is_fine)
        self._remove([folder])  # and the folders above it, once empty
        return objects, size

    async def _url(self, key: str, expires_seconds: int) -> str | None:
        return None  # the API streams local objects itself

    async def close(self) -> None:
        pass  # nothing held between operations: each Blob closes its own file

    async def _ping(self) -> None:
        try:
            await asyncio.wait_for(asyncio.to_thread(self._check_root), self.ping_timeout)
        except TimeoutError as exc:
            raise BlobStoreUnavailable(
                self.location, "ping", f"no answer in {self.ping_timeout:g}s") from exc
        except OSError as exc:
            raise self._unavailable("ping", exc) from exc

    def _check_root(self) -> None:
        # The store's own folder, inside a mount that must exist already (no parents: a
        # volume that is not mounted must not be replaced by a folder on the container's disk).
        with contextlib.suppress(OSError):
            self.root.mkdir(exist_ok=True)
        if not self.root.is_dir():
            raise FileNotFoundError(errno.ENOENT, "the root folder does not exist", str(self.root))
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "the root folder is not writable", str(self.root))

    async def _keys(self, prefix: str) -> AsyncIterator[str]:
        folders = [prefix.rpartition("/")[0]]
        while folders:
            folder = folders.pop()
            try:
                entries = await asyncio.to_thread(self._scan, folder)
            except OSError as exc:
                raise self._unavailable("keys", exc) from exc
            for name, is_dir in entries:
                if name.startswith("."):
                    continue  # unfinished writes
                key = f"{folder}/{name}" if folder else name
                if is_dir:
                    if key.startswith(prefix) or prefix.startswith(key + "/"):
                        folders.append(key)
                elif key.startswith(prefix):
                    yield key

    def _scan(self, folder: str) -> list[tuple[str, bool]]:
        path = self._path(folder) if folder else self.root
        try:
            with os.scandir(path) as it:
                return sorted((e.name, e.is_dir(follow_symlinks=False)) for e in it)
        except (FileNotFoundError, NotADirectoryError):
            return []


def _gone_is_fine(_function: object, _path: str, exc_info: tuple) -> None:
    # Another replica's sweeper removing the same folder at the same time.
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]
