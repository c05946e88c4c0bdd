"""Files (OpenAI's File object): bytes in the blob store, metadata in Redis.

A file's bytes live under `files/{YYYYMMDDHH}/{owner}/{file_id}.jsonl`, filed by the UTC hour it
was made so the sweeper deletes whole expired hours (services/api/sweeper.py), as it does for
outputs. Its metadata is a small hash (`fm:file:{id}`) whose TTL is `file_ttl_seconds`, and each
API key has an index of its files (`fm:files:{owner}`, a zset whose members sort by time, as
ids do) for listing. The bytes are written before the metadata, so a file that is listed can
be read; a crash in between leaves bytes that the sweeper deletes with their hour.
"""

import asyncio
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, BinaryIO

import redis.asyncio as aioredis
from redis.typing import EncodableT, FieldT

from services.api.batches import checker, listing
from services.api.batches.errors import FileNotFound
from shared import names, redis_replies
from shared.blobstore.base import BlobStore
from shared.blobstore.blob import Blob
from shared.blobstore.keys import UNOWNED, check_key, hour_of, hour_prefix
from shared.job_ids import created_at, new_job_id

FILES = "files"  # the blob store folder of files, by hour
FILE_PREFIX = "file-"
BATCH = "batch"  # the purpose of an uploaded batch input
BATCH_OUTPUT = "batch_output"  # the purpose of a batch's output and error files
CONTENT_TYPE = "application/jsonl"
MAX_LIST = 10_000  # OpenAI's largest page


def new_file_id(now: float | None = None) -> str:
    """`file-` and a dated id (shared/job_ids.py): ids sort by time, and say their hour."""
    return f"{FILE_PREFIX}{new_job_id(now)}"


def is_file_id(file_id: str) -> bool:
    rest = file_id.removeprefix(FILE_PREFIX)
    return rest != file_id and created_at(rest) is not None


def files_hour_prefix(hour: datetime) -> str:
    return hour_prefix(hour, FILES)


def file_blob_key(file_id: str, owner: str | None) -> str:
    made = created_at(file_id.removeprefix(FILE_PREFIX))
    hour = hour_of(made if made is not None else time.time())
    return check_key(f"{files_hour_prefix(hour)}{owner or UNOWNED}/{file_id}.jsonl")


@dataclass
class FileMeta:
    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    expires_at: int
    owner: str | None = None
    requests: int = 0  # a batch input's request count (not in OpenAI's object)

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": self.bytes,
                "created_at": self.created_at, "filename": self.filename,
                "purpose": self.purpose, "status": "processed", "expires_at": self.expires_at,
                "status_details": None}

    @property
    def key(self) -> str:
        return file_blob_key(self.id, self.owner)


def _meta(raw: Mapping[bytes, bytes] | Mapping[bytes | str, bytes | str]) -> FileMeta | None:
    h = redis_replies.text_hash(raw)
    if "id" not in h:
        return None
    return FileMeta(id=h["id"], bytes=int(h["bytes"]), created_at=int(h["created_at"]),
                    filename=h["filename"], purpose=h["purpose"],
                    expires_at=int(h["expires_at"]), owner=h.get("owner") or None,
                    requests=int(h.get("requests") or 0))


class FileStore:
    def __init__(self, redis: aioredis.Redis, blobs: BlobStore, ttl_seconds: int) -> None:
        self.redis = redis
        self.blobs = blobs
        self.ttl = ttl_seconds

    async def create(self, content: bytes, filename: str, purpose: str, owner: str | None,
                     requests: int = 0, file_id: str | None = None) -> FileMeta:
        """Store a file. With `file_id` (a batch's planned output), writing it again replaces
        it with the same bytes: a retried finalization is harmless."""
        meta = self._new(len(content), filename, purpose, owner, requests, file_id)
        await self.blobs.put(meta.key, content, CONTENT_TYPE)
        await self._index(meta)
        return meta

    async def create_file(self, f: BinaryIO, filename: str, purpose: str, owner: str | None,
                          requests: int = 0, file_id: str | None = None) -> FileMeta:
        """Store a file from a seekable file object, as create does, a chunk at a time."""
        size = await asyncio.to_thread(_size_of, f)
        meta = self._new(size, filename, purpose, owner, requests, file_id)
        await self.blobs.put_file(meta.key, f, CONTENT_TYPE)
        await self._index(meta)
        return meta

    async def check(self, f: BinaryIO, max_bytes: int, max_line_bytes: int) -> checker.Checked:
        """Check an uploaded batch input, a chunk at a time in a thread (the event loop goes on
        serving meanwhile); PayloadTooLarge or InvalidInput when it is not one."""
        return await asyncio.to_thread(checker.check_file, f, max_bytes, max_line_bytes)

    def _new(self, size: int, filename: str, purpose: str, owner: str | None, requests: int,
             file_id: str | None) -> FileMeta:
        now = time.time()
        file_id = file_id or new_file_id(now)
        made = int(created_at(file_id.removeprefix(FILE_PREFIX)) or now)
        return FileMeta(file_id, size, made, filename, purpose, made + self.ttl, owner, requests)

    async def _index(self, meta: FileMeta) -> None:
        """The metadata, once the bytes are written."""
        now = time.time()
        fields: dict[FieldT, EncodableT] = {
            k: ("" if v is None else v) for k, v in asdict(meta).items()}
        index = names.files_index_key(meta.owner)
        # Index members older than the TTL are gone from Redis: trim them with each write.
        cutoff = f"({FILE_PREFIX}{new_job_id(now - self.ttl)[:12]}"
        ttl_left = max(1, meta.expires_at - int(now))
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(names.file_key(meta.id), mapping=fields)
            pipe.expire(names.file_key(meta.id), ttl_left)
            pipe.zadd(index, {meta.id: 0})
            pipe.zremrangebylex(index, "-", cutoff)
            pipe.expire(index, self.ttl)
            await pipe.execute()

    async def find(self, file_id: str) -> FileMeta | None:
        if not is_file_id(file_id):
            return None  # not an id this API makes: never a Redis key
        return _meta(await self.redis.hgetall(names.file_key(file_id)))

    async def get(self, file_id: str, owner: str | None) -> FileMeta:
        """The caller's file; FileNotFound when it is missing, expired or another key's (the
        open API, `owner` None, sees every file)."""
        meta = await self.find(file_id)
        if meta is None or (owner is not None and meta.owner != owner):
            raise FileNotFound(file_id)
        return meta

    async def open(self, meta: FileMeta) -> Blob:
        return await self.blobs.open(meta.key)

    async def read(self, meta: FileMeta) -> bytes:
        return await (await self.open(meta)).read()

    async def delete(self, meta: FileMeta) -> None:
        # The metadata first: once it is gone no one is shown a file whose bytes are going.
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(names.file_key(meta.id))
            pipe.zrem(names.files_index_key(meta.owner), meta.id)
            await pipe.execute()
        await self.blobs.delete([meta.key])

    async def page(self, owner: str | None, purpose: str | None = None, limit: int = MAX_LIST,
                   after: str | None = None, order: str = "desc") -> tuple[list[FileMeta], bool]:
        """The owner's files from after `after`, newest first (`desc`) or oldest first, and
        whether there are more."""
        return await listing.page(
            self.redis, names.files_index_key(owner), names.file_key, _meta, limit, after,
            desc=order == "desc", keep=lambda m: purpose is None or m.purpose == purpose)


def _size_of(f: BinaryIO) -> int:
    return f.seek(0, os.SEEK_END)
