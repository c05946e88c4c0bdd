"""A queued job's card says where it stands in its model's line, and stops saying it once the
job has left the queue."""

import pytest

from tests.ui.helpers import open_page

pytestmark = pytest.mark.e2e


def test_a_queued_job_shows_its_place_in_line(page, ui_stack):
    # No worker of this stack serves tiny-sd: its jobs wait.
    body = {"model": "tiny-sd", "input": {"prompts": ["a red cube"], "steps": 2}}
    ids = [ui_stack.http.post("/v1/jobs", json=body).json()["id"] for _ in range(2)]
    try:
        open_page(page, path=f"/#/jobs/{ids[1]}")
        page.wait_for_selector("#job-queue:not([hidden])")
        assert page.text_content("#job-queue") == \
            "Place in line: 2 (1 output ahead) · no estimate yet"
        assert page.text_content("#job-status") == "queued"
    finally:
        for job_id in ids:
            ui_stack.http.post(f"/v1/jobs/{job_id}/cancel")
    page.wait_for_selector("#job-status.canceled")
    assert page.is_hidden("#job-queue")
    assert page.page_errors == []
