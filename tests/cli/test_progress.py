"""Following a queued job on a terminal: its place in line is polled and shown until it
starts, then its event stream takes over."""

from tests.cli.conftest import run_in_pty
from tests.cli.screen import final_screen
from tests.cli.test_fake_api import EVENTS, JOB_ID, job


def test_a_queued_job_shows_its_place_in_line_until_it_starts(fake_api):
    in_line = {**job("queued", 0), "queue": {
        "position": 4, "ahead": 3, "estimated_start": None, "basis": None}}
    fake_api.answer("GET", f"/v1/jobs/{JOB_ID}", in_line)
    fake_api.stream(EVENTS, [("status", job("running", 0)),
                             ("progress", {"done": 2, "total": 2}),
                             ("status", job("succeeded", 2))])
    shown = []

    def start() -> None:
        shown.append(True)
        fake_api.answer("GET", f"/v1/jobs/{JOB_ID}", job("running", 0))

    code, screen = run_in_pty(["status", JOB_ID, "--wait"], fake_api.url,
                              when="4th in line (3 outputs ahead)", then=start)
    assert code == 0, screen
    assert shown, screen
    lines = [line for line in final_screen(screen) if line]
    assert any(line.startswith(f"job {JOB_ID} succeeded") for line in lines), lines
