"""GET /v1/jobs/{id}/outputs/{i}: a text output from its sub-result, an image streamed from
the blob store (or a redirect to a presigned URL, when the setting and the backend allow),
never read whole into the API's memory."""

from collections.abc import AsyncIterator

from fastapi import Response
from fastapi.responses import RedirectResponse, StreamingResponse

from shared.blobstore import Blob, BlobStore
from shared.errors import OutputNotFound
from shared.jobstore import JobRecord, JobStore
from shared.settings import Settings

# Outputs never change once stored: a browser may keep them for as long as the job lives.
IMMUTABLE = {"Cache-Control": "private, max-age=86400, immutable"}


async def output_response(job: JobRecord, index: int, store: JobStore, blobs: BlobStore,
                          settings: Settings) -> Response:
    if not 0 <= index < job.total:
        raise OutputNotFound(f"job {job.id} has outputs 0..{job.total - 1}, not {index}")
    result = await store.result(job.id, index)
    if result is None or result.output is None:
        raise OutputNotFound(f"output {index} of job {job.id} is not ready")
    if job.task == "text-generation":
        return Response(result.model_dump_json(include={"output"}),
                        media_type="application/json")
    if result.blob is None:  # stored in Redis by a worker older than the blob store
        png = await store.blob(job.id, index)
        if png is None:
            raise OutputNotFound(f"output {index} of job {job.id} is not ready")
        return Response(png, media_type="image/png", headers=IMMUTABLE)
    if settings.blob_presigned_redirect:
        url = await blobs.url(result.blob, settings.blob_url_expires_seconds)
        if url is not None:
            return RedirectResponse(url, status_code=307)
    blob = await blobs.open(result.blob)
    return StreamingResponse(_chunks(blob), media_type=blob.content_type,
                             headers={**IMMUTABLE, "Content-Length": str(blob.size)})


async def _chunks(blob: Blob) -> AsyncIterator[bytes]:
    # Closed however the response ends (a client gone mid-stream included): an open S3 body
    # holds a pooled connection.
    async with blob:
        async for chunk in blob:
            yield chunk
