"""/v1/jobs: create a job, read it, fetch its outputs."""

from typing import Annotated

from fastapi import APIRouter, Body, Response

from services.api.deps import DispatcherDep, JobDep, JobStoreDep, RegistryDep, SettingsDep
from services.api.envelope import envelope
from services.api.submission import submit
from shared.errors import OutputNotFound
from shared.job import Job, JobRequest

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.post("", status_code=202, response_model=Job)
async def create_job(
    req: Annotated[JobRequest, Body()],
    store: JobStoreDep,
    registry: RegistryDep,
    dispatcher: DispatcherDep,
    settings: SettingsDep,
) -> Job:
    rec = await submit(req, store, registry, dispatcher)
    return envelope(rec, settings.public_url)


@router.get("/{job_id}", response_model=Job)
async def get_job(job: JobDep, settings: SettingsDep) -> Job:
    return envelope(job, settings.public_url)


@router.get(
    "/{job_id}/outputs/{index}",
    responses={200: {"content": {"image/png": {}, "application/json": {}}}},
)
async def get_output(job: JobDep, index: int, store: JobStoreDep) -> Response:
    if not 0 <= index < job.total:
        raise OutputNotFound(f"job {job.id} has outputs 0..{job.total - 1}, not {index}")
    if job.task == "image-generation":
        png = await store.blob(job.id, index)
        if png is None:
            raise OutputNotFound(f"output {index} of job {job.id} is not ready")
        return Response(
            png,
            media_type="image/png",
            headers={"Cache-Control": "private, max-age=86400, immutable"},
        )
    results = await store.results(job.id)
    if index not in results or results[index].output is None:
        raise OutputNotFound(f"output {index} of job {job.id} is not ready")
    return Response(
        results[index].model_dump_json(include={"output"}), media_type="application/json"
    )
