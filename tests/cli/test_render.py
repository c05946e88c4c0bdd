"""What `fibermill` prints of a queued job: its place in line and estimated start."""

from datetime import UTC, datetime

from rich.console import Console

from services.cli.render import job_summary, queue_line

NOW = datetime(2026, 12, 6, 12, 0, 0, tzinfo=UTC)


def test_a_place_in_line_with_an_estimate():
    queue = {"position": 3, "ahead": 2, "estimated_start": "2026-12-06T12:00:40Z",
             "basis": {"finished": 12, "seconds": 24.0, "per_second": 0.5}}
    assert queue_line(queue, NOW) == ("3rd in line (2 outputs ahead), starts in about 40s "
                                      "(at 12:00:40 UTC)")


def test_long_waits_read_in_minutes_and_hours_and_a_late_one_as_now():
    def at(iso: str) -> dict:
        return {"position": 12, "ahead": 11, "estimated_start": iso, "basis": None}

    assert "12th in line (11 outputs ahead), starts in about 15 min" in queue_line(
        at("2026-12-06T12:15:00+00:00"), NOW)
    assert "starts in about 2.5 h (at 14:30:00 UTC)" in queue_line(
        at("2026-12-06T14:30:00+00:00"), NOW)
    assert "starts in about 0s" in queue_line(at("2026-12-06T11:59:00+00:00"), NOW)


def test_no_measure_no_estimate():
    queue = {"position": 1, "ahead": 0, "estimated_start": None, "basis": None}
    assert queue_line(queue, NOW) == ("1st in line (0 outputs ahead), no estimate yet "
                                      "(nothing of its model finished lately)")
    assert queue_line(None) is None


def test_the_summary_of_a_queued_job_says_where_it_stands():
    console = Console(record=True, width=200, color_system=None)
    job = {"id": "f" * 32, "status": "queued", "model": "digits", "task": "image-generation",
           "progress": {"done": 0, "total": 1}, "metrics": {}, "error": None,
           "queue": {"position": 2, "ahead": 1, "estimated_start": None, "basis": None}}
    job_summary(console, job)
    lines = console.export_text().splitlines()
    assert lines[2] == "  2nd in line (1 output ahead), no estimate yet (nothing of its model " \
                       "finished lately)"
    job_summary(console, {**job, "queue": None, "status": "running"})
    assert "in line" not in console.export_text()
