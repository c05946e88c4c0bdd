"""/v1/files: OpenAI's Files API, for the Batch API's input and output files."""

from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, File, Form, Query, UploadFile
from fastapi.responses import StreamingResponse

from services.api.auth import PrincipalDep, authenticate
from services.api.batches.deps import FilesDep
from services.api.batches.files import BATCH, MAX_LIST, FileMeta
from services.api.deps import SettingsDep
from services.api.quotas import QuotasDep
from shared.blobstore.blob import Blob
from shared.errors import InvalidInput, PayloadTooLarge

router = APIRouter(prefix="/v1/files", tags=["files"], dependencies=[Depends(authenticate)])

MAX_FILENAME_CHARS = 255


@router.post("")
async def upload_file(
    principal: PrincipalDep,
    files: FilesDep,
    settings: SettingsDep,
    quotas: QuotasDep,
    file: Annotated[UploadFile | None, File(description="A JSONL file of batch requests")] = None,
    purpose: Annotated[str | None, Form(description="Only `batch` is accepted")] = None,
) -> dict[str, Any]:
    """Upload a batch's input file (multipart `file` and `purpose=batch`). It is checked line
    by line; a file that is not a valid batch input is refused with every problem's line
    number (a line holds one request of at most `FIBERMILL_MAX_BODY_BYTES`, nested at most 64
    deep). Kept for `FIBERMILL_FILE_TTL_SECONDS` (30 days) at most."""
    if purpose != BATCH:
        raise InvalidInput("purpose", f"only purpose 'batch' can be uploaded, not {purpose!r}"
                           if purpose is not None else "is required (only 'batch')")
    if file is None:
        raise InvalidInput("file", "is required: the JSONL file, as a multipart file field")
    limit = settings.max_file_bytes
    if file.size is not None and file.size > limit:
        raise PayloadTooLarge(
            f"the file is larger than the limit of {limit} bytes (FIBERMILL_MAX_FILE_BYTES)")
    # The upload is in a spooled temporary file (on disk past 1 MiB): it is checked and stored
    # from there a chunk at a time, never read whole.
    checked = await files.check(file.file, limit, settings.max_body_bytes)
    name = (file.filename or "batch.jsonl")[:MAX_FILENAME_CHARS]
    async with quotas.upload(principal.key_id, checked.size):
        meta = await files.create_file(file.file, name, purpose, principal.key_id,
                                       checked.requests)
    return meta.openai()


@router.get("")
async def list_files(
    principal: PrincipalDep,
    files: FilesDep,
    purpose: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = MAX_LIST,
    after: str | None = None,
    order: Literal["asc", "desc"] = "desc",
) -> dict[str, Any]:
    """The caller's files, newest first (`order=asc`: oldest first); `after` a file id to
    page on from."""
    found, more = await files.page(principal.key_id, purpose, limit, after, order)
    return _page([m.openai() for m in found], more)


def _page(data: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": more}


async def _file(file_id: str, files: FilesDep, principal: PrincipalDep) -> FileMeta:
    return await files.get(file_id, principal.key_id)


FileDep = Annotated[FileMeta, Depends(_file)]


@router.get("/{file_id}")
async def get_file(meta: FileDep) -> dict[str, Any]:
    return meta.openai()


@router.get("/{file_id}/content",
            responses={200: {"content": {"application/jsonl": {}}, "description": "The file"}})
async def file_content(meta: FileDep, files: FilesDep) -> StreamingResponse:
    blob = await files.open(meta)
    return StreamingResponse(_chunks(blob), media_type="application/jsonl",
                             headers={"Content-Length": str(blob.size)})


async def _chunks(blob: Blob) -> AsyncIterator[bytes]:
    async with blob:
        async for chunk in blob:
            yield chunk


@router.delete("/{file_id}")
async def delete_file(meta: FileDep, files: FilesDep) -> dict[str, Any]:
    await files.delete(meta)
    return {"id": meta.id, "object": "file", "deleted": True}
