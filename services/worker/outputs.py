"""Outputs go straight to the blob store; the sub-result carries only their key. A blob store
that is away is waited out for a while (the sub-request keeps its lease meanwhile: the
heartbeat renews it), then the sub-request fails with an error naming the store."""

import asyncio
import logging
import time

from shared.blobstore.base import BlobStore
from shared.blobstore.keys import output_key
from shared.errors import BlobStoreUnavailable
from shared.messages import SubRequest

log = logging.getLogger(__name__)

FIRST_RETRY_SECONDS = 0.5
MAX_RETRY_SECONDS = 5.0


class OutputWriter:
    def __init__(self, blobs: BlobStore, outage_seconds: float) -> None:
        self.blobs = blobs
        self.outage_seconds = outage_seconds

    async def write(self, sub: SubRequest, png: bytes) -> str:
        """Store a sub-request's image under its own key (a second run of it writes the same
        key, so an output is never stored twice) and return the key; BlobStoreUnavailable
        once the store has been away for `outage_seconds`."""
        key = output_key(sub.job_id, sub.index, sub.owner)
        give_up = time.monotonic() + self.outage_seconds
        pause = FIRST_RETRY_SECONDS
        while True:
            try:
                await self.blobs.put(key, png, "image/png")
                return key
            except BlobStoreUnavailable as exc:
                if time.monotonic() + pause > give_up:
                    raise
                log.warning("output %s not stored yet (%s); retrying in %.1fs", key, exc, pause)
                await asyncio.sleep(pause)
                pause = min(pause * 2, MAX_RETRY_SECONDS)
