"""Assemble a job's output from its sub-results, in input order."""

from services.api.envelope import base_url, output_url
from shared.inputs import ImageOutput, TextOutput
from shared.jobstore import JobRecord
from shared.messages import GeneratedImage, JobError, SubResult


def assemble(rec: JobRecord, results: dict[int, SubResult],
             public_url: str) -> list[TextOutput | ImageOutput | None]:
    base = base_url(rec, public_url)
    out: list[TextOutput | ImageOutput | None] = []
    for i in range(rec.total):
        r = results.get(i)
        if r is None or r.output is None:
            out.append(None)
        elif isinstance(r.output, GeneratedImage):
            out.append(ImageOutput(url=output_url(base, rec.id, i), worker=r.worker,
                                   **r.output.model_dump()))
        else:
            out.append(TextOutput.of(r.output, r.worker))
    return out


def first_error(results: dict[int, SubResult]) -> tuple[int, JobError] | None:
    failed = sorted((i, r.error) for i, r in results.items() if r.error is not None)
    return failed[0] if failed else None
