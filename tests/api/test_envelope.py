"""A job's links are absolute: from FIBERMILL_PUBLIC_URL when set, else from the base URL the
job was submitted to, in answers and in what is stored for webhooks alike."""

import pytest
from fastapi.testclient import TestClient

from services.api.app import create_app
from services.api.assembly import assemble
from services.api.envelope import envelope
from shared.job import JobMeta, JobStatus
from shared.jobstore import JobRecord
from shared.messages import GeneratedImage, SubResult


def _rec(base_url: str | None) -> JobRecord:
    return JobRecord("j1", "image-generation", "digits", JobStatus.QUEUED, {"prompts": ["3"]},
                     1, 0.0, meta=JobMeta(base_url=base_url))


def test_links_start_at_the_submitting_requests_base_url():
    job = envelope(_rec("http://10.0.0.5:8000"), public_url="")
    assert job.urls.get == "http://10.0.0.5:8000/v1/jobs/j1"
    assert job.urls.events == "http://10.0.0.5:8000/v1/jobs/j1/events"


def test_the_public_url_wins_when_set():
    job = envelope(_rec("http://10.0.0.5:8000"), public_url="https://gen.example.com/")
    assert job.urls.cancel == "https://gen.example.com/v1/jobs/j1/cancel"


def test_stored_image_outputs_carry_absolute_urls():
    results = {0: SubResult(job_id="j1", index=0, output=GeneratedImage(seed=1, width=16,
                                                                         height=16))}
    [out] = assemble(_rec("http://10.0.0.5:8000"), results, public_url="")
    assert out.url == "http://10.0.0.5:8000/v1/jobs/j1/outputs/0"


@pytest.fixture
def client(settings_env):
    with TestClient(create_app(), base_url="http://api.internal:8123") as c:
        yield c


def test_a_submitted_job_answers_with_absolute_links(client):
    resp = client.post("/v1/jobs", json={"model": "tiny-gpt2", "input": {"prompts": ["x"]}})
    assert resp.status_code == 202, resp.text
    job_id = resp.json()["id"]
    assert resp.headers["Location"] == f"http://api.internal:8123/v1/jobs/{job_id}"
    # Read back later, from the store, the job keeps the base it was submitted to.
    assert client.get(f"/v1/jobs/{job_id}").json()["urls"]["get"] == resp.headers["Location"]
