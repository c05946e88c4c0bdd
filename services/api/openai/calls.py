"""One OpenAI-compatible call: translated into a job, submitted like any other (rate limit,
queue-depth backpressure, Idempotency-Key), then waited for (`Prefer: wait`'s machinery) or
streamed, and translated back."""

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse
from starlette.background import BackgroundTask

from services.api.auth import Principal
from services.api.envelope import base_url, output_url
from services.api.events import EventHub, wait_final
from services.api.lifecycle import Lifecycle
from services.api.openai.schemas import ImageGenerationRequest, OpenAIRequest
from services.api.openai.stream import TextRequest, relay
from services.api.openai.translate import failure, job_request, text_response
from services.api.ratelimit import RateLimiter, bucket_key
from services.api.submission import Submissions
from services.api.watchers import Watchers
from shared.blobstore.base import BlobStore
from shared.blobstore.keys import output_key
from shared.errors import JobNotFound, WaitTimedOut
from shared.job import JobRequest, JobStatus
from shared.job_ids import new_job_id
from shared.jobstore import JobRecord, JobStore
from shared.registry import ModelRegistry
from shared.settings import Settings

log = logging.getLogger(__name__)

# Cancels of jobs whose stream's client went away: they run after the stream's task is gone.
_cancels: set[asyncio.Task] = set()


@dataclass
class Calls:
    registry: ModelRegistry
    submissions: Submissions
    limiter: RateLimiter
    hub: EventHub
    store: JobStore
    watchers: Watchers
    lifecycle: Lifecycle
    blobs: BlobStore
    settings: Settings

    async def answer(self, req: OpenAIRequest, principal: Principal, base: str,
                     idempotency_key: str | None) -> JSONResponse | EventSourceResponse:
        job = job_request(req, self.registry)
        # The caller's stream or wait is checked against its limit and held in one step (no
        # await between), before the job exists: calls arriving at once cannot all pass a
        # check that none of them has recorded yet, and an accepted job is never answered
        # with an error. A stream's response holds it until the stream ends or its client
        # goes; any other call, until its answer.
        slot = contextlib.ExitStack()
        slot.enter_context(self.watchers.hold(bucket_key(principal)))
        handed_over = False
        try:
            if not isinstance(req, ImageGenerationRequest) and req.stream:
                response = await self._stream(req, job, principal, base, idempotency_key, slot)
                handed_over = True
                return response
            return await self._answer(req, job, principal, base, idempotency_key)
        finally:
            if not handed_over:
                slot.close()

    async def _answer(self, req: OpenAIRequest, job: JobRequest, principal: Principal,
                      base: str, idempotency_key: str | None) -> JSONResponse:
        rec = (await self.submissions.submit(job, principal, idempotency_key, base,
                                             bucket=self.limiter.bucket(principal))).job
        rec = await self._wait(rec)
        if rec.status != JobStatus.SUCCEEDED:
            status, body = failure(rec)
            return JSONResponse(body, status_code=status)
        if isinstance(req, ImageGenerationRequest):
            return JSONResponse(await self._images(req, rec))
        return JSONResponse(text_response(req, rec))

    async def _wait(self, rec: JobRecord) -> JobRecord:
        if not rec.final:
            seconds = self.settings.openai_wait_seconds
            rec = await wait_final(self.hub, self.store, rec.id, seconds, rec)
            if not rec.final:
                raise WaitTimedOut(rec.id, seconds)
        return rec

    async def _images(self, req: ImageGenerationRequest, rec: JobRecord) -> dict[str, Any]:
        """Each image as a URL (a presigned one where the store has them, else the job's
        output URL, read with the same API key) or inline as base64."""
        data = []
        for i in range(rec.total):
            key = output_key(rec.id, i, rec.meta.owner)
            if req.response_format == "b64_json":
                async with await self.blobs.open(key) as blob:
                    png = b"".join([chunk async for chunk in blob])
                data.append({"b64_json": base64.b64encode(png).decode()})
                continue
            url = await self.blobs.url(key, self.settings.blob_url_expires_seconds)
            data.append({"url": url or output_url(base_url(rec, self.settings.public_url),
                                                  rec.id, i)})
        return {"created": int(rec.created_at), "data": data}

    async def _stream(self, req: TextRequest, job: JobRequest, principal: Principal,
                      base: str, idempotency_key: str | None, slot: contextlib.ExitStack
                      ) -> EventSourceResponse:
        """The stream's response, which releases `slot` when the stream ends, its client goes
        away, or (the response never started) the response is done with."""
        job_id = new_job_id()
        listening = contextlib.AsyncExitStack()
        # Subscribed before the job exists: its first tokens cannot slip by.
        listener = await listening.enter_async_context(self.hub.listen(job_id, live=True))
        try:
            rec = (await self.submissions.submit(job, principal, idempotency_key, base,
                                                 job_id=job_id,
                                                 bucket=self.limiter.bucket(principal),
                                                 watched=True)).job
        except BaseException:
            await listening.aclose()
            raise
        if rec.id != job_id:  # an Idempotency-Key gave back an earlier job: follow that one
            await listening.aclose()
            listener = await listening.enter_async_context(self.hub.listen(rec.id, live=True))
            await self.store.watch(rec.id)
        # Closing a slot twice is harmless: the stream's end and the response's both do.
        return EventSourceResponse(self._events(req, rec, listener, listening, slot), ping=15,
                                   background=BackgroundTask(slot.close))

    async def _events(self, req: TextRequest, rec: JobRecord, listener,
                      listening: contextlib.AsyncExitStack, slot: contextlib.ExitStack
                      ) -> AsyncIterator[dict[str, str]]:
        ended = False
        try:
            async with listening:
                async for chunk in relay(req, rec, listener, self.store):
                    yield {"data": json.dumps(chunk, separators=(",", ":"))}
            yield {"data": "[DONE]"}
            ended = True
        finally:
            slot.close()
            if not ended:
                # The client went away: the job's work is wasted, so it stops. Not awaited
                # here: this generator is being closed, and its awaits would be canceled too.
                task = asyncio.ensure_future(self._cancel(rec.id))
                _cancels.add(task)
                task.add_done_callback(_cancels.discard)

    async def _cancel(self, job_id: str) -> None:
        try:
            rec = await self.store.get(job_id)
            if not rec.final:
                await self.lifecycle.cancel(rec)
                log.info("job %s canceled: its stream's client went away", job_id)
        except JobNotFound:
            pass
        except Exception:
            log.warning("could not cancel job %s after its stream ended", job_id, exc_info=True)
