"""/v1/batches: OpenAI's Batch API; each line of a batch runs as a Fibermill job
(services/api/batches/driver.py)."""

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field

from services.api.auth import PrincipalDep, authenticate
from services.api.batches.deps import BatchesDep, FilesDep
from services.api.batches.errors import FileNotFound
from services.api.batches.files import BATCH
from services.api.batches.store import COMPLETION_WINDOW_SECONDS, openai_batch
from services.api.deps import SettingsDep
from services.api.openai.translate import BATCH_ENDPOINTS
from services.api.quotas import QuotasDep
from services.api.webhooks.ssrf import check_webhook_url
from shared.errors import InvalidInput, Problem

router = APIRouter(prefix="/v1/batches", tags=["batches"], dependencies=[Depends(authenticate)])

MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(description="A file uploaded with purpose `batch`")
    endpoint: str = Field(description=f"One of {', '.join(BATCH_ENDPOINTS)}; each line may "
                          "use either (a Fibermill extension)")
    completion_window: str = Field(description="Only `24h`")
    metadata: dict[str, str] | None = Field(None, description="Up to 16 string pairs")
    webhook: AnyHttpUrl | None = Field(None, description=(
        "Fibermill extension (OpenAI's client: `extra_body`): an http(s) URL that receives a "
        "signed `batch.completed` (or failed, expired, cancelled) event when the batch ends"))


@router.post("")
async def create_batch(body: BatchCreate, principal: PrincipalDep, files: FilesDep,
                       batches: BatchesDep, settings: SettingsDep, quotas: QuotasDep
                       ) -> dict[str, Any]:
    """Run every request of an uploaded input file; the batch starts `validating`."""
    problems: list[Problem] = []
    if body.endpoint not in BATCH_ENDPOINTS:
        problems.append(Problem("endpoint", f"must be one of {', '.join(BATCH_ENDPOINTS)}, "
                                f"not {body.endpoint!r}"))
    if body.completion_window not in COMPLETION_WINDOW_SECONDS:
        problems.append(Problem("completion_window", f"must be '24h', not "
                                f"{body.completion_window!r}"))
    problems += _metadata_problems(body.metadata)
    try:
        meta = await files.get(body.input_file_id, principal.key_id)
    except FileNotFound:
        problems.append(Problem("input_file_id", f"no file {body.input_file_id!r} (upload one "
                                "with purpose 'batch')"))
    else:
        if meta.purpose != BATCH:
            problems.append(Problem("input_file_id", f"file {meta.id} has purpose "
                                    f"{meta.purpose!r}; a batch's input has purpose 'batch'"))
    if body.webhook is not None:
        try:
            await check_webhook_url(str(body.webhook), settings.webhook_allow_private)
        except InvalidInput as exc:
            problems += exc.problems
    if problems:
        raise InvalidInput.of(problems)
    async with quotas.new_batch(principal.key_id):
        h = await batches.create(body.input_file_id, body.endpoint, body.completion_window,
                                 body.metadata, principal.key_id,
                                 str(body.webhook) if body.webhook is not None else None)
    return openai_batch(h)


def _metadata_problems(metadata: dict[str, str] | None) -> list[Problem]:
    if metadata is None:
        return []
    problems = []
    if len(metadata) > MAX_METADATA_PAIRS:
        problems.append(Problem("metadata", f"at most {MAX_METADATA_PAIRS} pairs, not "
                                f"{len(metadata)}"))
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_CHARS:
            problems.append(Problem("metadata", f"key {key[:20]!r}... is longer than "
                                    f"{MAX_METADATA_KEY_CHARS} characters"))
        if len(value) > MAX_METADATA_VALUE_CHARS:
            problems.append(Problem(f"metadata.{key}", "is longer than "
                                    f"{MAX_METADATA_VALUE_CHARS} characters"))
    return problems


@router.get("")
async def list_batches(
    principal: PrincipalDep,
    batches: BatchesDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    """The caller's batches, newest first; `after` a batch id to page on from."""
    found, more = await batches.page(principal.key_id, limit, after)
    data = [openai_batch(h) for h in found]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": more}


@router.get("/{batch_id}")
async def get_batch(batch_id: str, principal: PrincipalDep, batches: BatchesDep
                    ) -> dict[str, Any]:
    return openai_batch(await batches.get(batch_id, principal.key_id))


@router.post("/{batch_id}/cancel")
async def cancel_batch(batch_id: str, principal: PrincipalDep, batches: BatchesDep
                       ) -> dict[str, Any]:
    """Cancel the batch: it is `cancelling` until the jobs of its running lines are canceled,
    then `cancelled`, with the output and error files of what finished (every line not run
    is in the error file, code `batch_cancelled`). A batch that ended is returned as it is."""
    await batches.get(batch_id, principal.key_id)
    await batches.cancel(batch_id)
    return openai_batch(await batches.get(batch_id, principal.key_id))
