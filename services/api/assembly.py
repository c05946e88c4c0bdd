"""Assemble a job's output from its sub-results, in input order."""

from services.api.envelope import output_url
from shared.job import JobError
from shared.jobstore import JobRecord
from shared.subrequest import SubResult


def assemble(rec: JobRecord, results: dict[int, SubResult], base_url: str) -> list[dict | None]:
    out: list[dict | None] = []
    for i in range(rec.total):
        r = results.get(i)
        if r is None or r.output is None:
            out.append(None)
            continue
        item = dict(r.output)
        if rec.task == "image-generation":
            item = {"url": output_url(base_url, rec.id, i), **item}
        item["worker"] = r.worker
        out.append(item)
    return out


def first_error(results: dict[int, SubResult]) -> tuple[int, JobError] | None:
    failed = sorted((i, r.error) for i, r in results.items() if r.error is not None)
    return failed[0] if failed else None
