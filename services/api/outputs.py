"""GET /v1/jobs/{id}/outputs/{i}: a text output from its sub-result, an image streamed from
the blob store (or a redirect to a presigned URL, when the setting and the backend allow),
never read whole into the API's memory.

An image outlives its job's record (shared/retention.py): once the record has expired, the
output is looked up where its job's id and the caller's key file it, so only the key that made
it finds it. Past its own retention it is 410 Gone, with or without the record."""

import time
from collections.abc import AsyncIterator

from fastapi import Response
from fastapi.responses import RedirectResponse, StreamingResponse

from shared.blobstore.base import BlobStore
from shared.blobstore.blob import Blob
from shared.blobstore.keys import output_key
from shared.errors import BlobNotFound, OutputExpired, OutputNotFound
from shared.inputs import TextOutput
from shared.jobstore import JobRecord, JobStore
from shared.messages import GeneratedText
from shared.retention import missing_job, outputs_expired
from shared.settings import Settings

# Outputs never change once stored: a browser may keep them for as long as the job lives.
IMMUTABLE = {"Cache-Control": "private, max-age=86400, immutable"}


async def output_response(job_id: str, job: JobRecord | None, index: int, owner: str | None,
                          store: JobStore, blobs: BlobStore, settings: Settings) -> Response:
    """Output `index` of the job; `job` is None when its record is gone."""
    if outputs_expired(job_id, settings.output_ttl_seconds, time.time()):
        raise OutputExpired(job_id, index, settings.output_ttl_seconds)
    if job is None:
        return await _without_record(job_id, index, owner, store, blobs, settings)
    if not 0 <= index < job.total:
        raise OutputNotFound(f"job {job.id} has outputs 0..{job.total - 1}, not {index}")
    if job.final:
        return await _from_record(job, index, blobs, settings)
    result = await store.result(job.id, index)
    if result is None or result.output is None:
        raise OutputNotFound(f"output {index} of job {job.id} is not ready")
    if isinstance(result.output, GeneratedText):  # a text job's; an image job's has a blob
        return _text(result.output)
    if result.blob is None:
        raise OutputNotFound(f"output {index} of job {job.id} has no image")
    return await _image(result.blob, blobs, settings)


async def _from_record(job: JobRecord, index: int, blobs: BlobStore,
                       settings: Settings) -> Response:
    """A final job's output, from its record: its sub-results are gone once it is final."""
    entry = job.output[index] if job.output and index < len(job.output) else None
    if entry is None:
        raise OutputNotFound(f"output {index} of job {job.id} was not made: the job "
                             f"{job.status.value}")
    if job.task == "text-generation":
        return _text(TextOutput.model_validate(entry))
    return await _image(output_key(job.id, index, job.meta.owner), blobs, settings)


def _text(output: GeneratedText) -> Response:
    body = output.model_dump_json(include=set(GeneratedText.model_fields))
    return Response(f'{{"output":{body}}}', media_type="application/json")


async def _without_record(job_id: str, index: int, owner: str | None, store: JobStore,
                          blobs: BlobStore, settings: Settings) -> Response:
    if index >= 0:
        try:
            return await _image(output_key(job_id, index, owner), blobs, settings,
                                check_exists=True)
        except BlobNotFound:
            pass
    # No image: a text job's outputs lived in its record; or the id was never made here.
    raise missing_job(job_id, store.finished_ttl, time.time())


async def _image(key: str, blobs: BlobStore, settings: Settings,
                 check_exists: bool = False) -> Response:
    if settings.blob_presigned_redirect:
        if check_exists:  # a presigned URL of a key that is not there would be a dead link
            await (await blobs.open(key)).aclose()
        url = await blobs.url(key, settings.blob_url_expires_seconds)
        if url is not None:
            return RedirectResponse(url, status_code=307)
    blob = await blobs.open(key)
    return StreamingResponse(_chunks(blob), media_type=blob.content_type,
                             headers={**IMMUTABLE, "Content-Length": str(blob.size)})


async def _chunks(blob: Blob) -> AsyncIterator[bytes]:
    # Closed however the response ends (a client gone mid-stream included): an open S3 body
    # holds a pooled connection.
    async with blob:
        async for chunk in blob:
            yield chunk
