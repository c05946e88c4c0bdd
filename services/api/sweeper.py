"""Deletes the outputs whose retention ended (shared/retention.py), a whole hour at a time.

Every API replica runs it: it keeps no state (it lists the hour folders under `outputs/` each
time) and deleting is idempotent, so two replicas that sweep the same hour at once only repeat
work, and a replica lost mid-sweep leaves the rest to the next sweep. An idle sweep costs one
listing call. Everything filed under an hour goes, whatever became of its job: the partial
outputs of a job that failed or was canceled, and a second run's rewrite of an output alike.

Files (the Batch API's input, output and error files, and a batch's copy of its input) are swept
the same way under `files/`, by `file_ttl_seconds`: their metadata in Redis expires with that
TTL counted from the file's making, and its bytes go with their hour, at most an hour later.

Whether an hour is past its retention is read on the Redis server's clock, so replicas whose
clocks disagree do not delete an hour early (one running fast) or keep it late.
"""

import asyncio
import logging
from datetime import UTC, datetime

import redis.asyncio as aioredis
from prometheus_client import Counter, Gauge
from redis.exceptions import RedisError

from services.api.batches.files import FILES
from shared.asyncio_compat import raise_if_cancelled
from shared.blobstore.base import BlobStore
from shared.blobstore.keys import OUTPUTS, hour_prefix
from shared.errors import BlobStoreUnavailable
from shared.redis_clock import redis_now
from shared.retention import hour_expired
from shared.settings import Settings

log = logging.getLogger(__name__)

FOLDERS_SWEPT = Counter("fibermill_retention_folders_swept",
                      "Hour folders of outputs deleted because their retention ended")
FILE_FOLDERS_SWEPT = Counter("fibermill_retention_file_folders_swept",
                             "Hour folders of files (Batch API) deleted because their "
                             "retention ended")
OLDEST_HOUR_AGE = Gauge(
    "fibermill_retention_oldest_output_age_seconds",
    "Age of the oldest hour of outputs still in the blob store, at the last sweep (stays "
    "below the output TTL plus an hour and the sweep interval while the sweeper keeps up)")


class Sweeper:
    def __init__(self, blobs: BlobStore, settings: Settings, redis: aioredis.Redis) -> None:
        self.blobs = blobs
        self.settings = settings
        self.redis = redis  # its clock decides what is past its retention

    async def run(self) -> None:
        while True:
            # An interval first: replicas that start together (a rollout) do not all sweep at
            # once, and nothing is due so urgently that a start must wait on a listing.
            await asyncio.sleep(self.settings.sweep_interval_seconds)
            raise_if_cancelled()
            try:
                await self.sweep()
            except BlobStoreUnavailable as exc:
                # Not this replica's fault, and /readyz reports the store itself: the next
                # sweep picks up where this one stopped.
                log.warning("retention: sweep put off until the blob store is back: %s", exc)
            except RedisError as exc:
                log.warning("retention: sweep put off until Redis (its clock) is back: %s", exc)

    async def sweep(self, now: float | None = None) -> int:
        """Delete every hour of outputs, and of files, past its retention at `now` (unset:
        the Redis server's time); the number of outputs deleted."""
        now = await redis_now(self.redis) if now is None else now
        await self.sweep_files(now)
        return await self.sweep_outputs(now)

    async def sweep_files(self, now: float | None = None) -> int:
        """Delete every hour of files past `file_ttl_seconds`; the number of files deleted."""
        now = await redis_now(self.redis) if now is None else now
        deleted, _ = await self._sweep_hours(FILES, self.settings.file_ttl_seconds, now,
                                             FILE_FOLDERS_SWEPT, "files")
        return deleted

    async def sweep_outputs(self, now: float) -> int:
        deleted, kept = await self._sweep_hours(OUTPUTS, self.settings.output_ttl_seconds, now,
                                                FOLDERS_SWEPT, "outputs of jobs")
        OLDEST_HOUR_AGE.set(now - min(kept).timestamp() if kept else 0)
        return deleted

    async def _sweep_hours(self, top: str, ttl: int, now: float, swept: Counter,
                           what: str) -> tuple[int, list[datetime]]:
        """Delete the hour folders under `top/` past `ttl`: the objects deleted, and the hours
        kept."""
        deleted = 0
        kept: list[datetime] = []
        for name in await self.blobs.folders(f"{top}/"):
            try:
                hour = datetime.strptime(name, "%Y%m%d%H").replace(tzinfo=UTC)
            except ValueError:
                continue  # not an hour folder: not the sweeper's to delete
            if not hour_expired(hour, ttl, now):
                kept.append(hour)
                continue
            objects = await self.blobs.delete_prefix(hour_prefix(hour, top))
            swept.inc()
            deleted += objects
            log.info("retention: deleted %d %s made in the hour from %s", objects, what,
                     hour.isoformat())
        return deleted, kept
