"""The job-end line (shared/job_log.py), written by the job store's caller whose script made the
job final: once per job, however many callers race to end it, on a real Redis."""

import asyncio
import logging
import re

import pytest

from shared.job import JobStatus
from shared.jobstore import Finished, JobStore, NewJob
from shared.logs import FIELDS
from shared.messages import GeneratedText, JobError, SubRequest, SubResult, TextItem

LOGGER = "fibermill.jobs"
LINE = re.compile(r"^job (?P<id>\S+) (?P<status>\w+): model=tiny-gpt2 task=text-generation "
                  r"queued=(?P<queued>[\d.]+)s running=(?P<running>[\d.]+)s "
                  r"total=(?P<total>[\d.]+)s(?: error=(?P<error>\w+))?$")


async def _job(store: JobStore, job_id: str, total: int) -> None:
    await store.create(NewJob(job_id, "text-generation", "tiny-gpt2", {"prompts": ["a"]}, total))


def _ends(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER]


async def test_racing_finalizes_write_one_line(store, caplog):
    await _job(store, "end1", total=2)
    error = JobError(code="deadline_exceeded", message="the job did not finish in time")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        wins = await asyncio.gather(*[
            store.finalize("end1", JobStatus.FAILED, [None, None], error) for _ in range(10)])
    assert sum(wins) == 1
    (record,) = _ends(caplog)
    line = LINE.match(record.getMessage())
    assert line, record.getMessage()
    assert (line["id"], line["status"], line["error"]) == ("end1", "failed", "deadline_exceeded")
    assert float(line["running"]) == 0  # it never started: all of it was queued
    assert float(line["queued"]) == float(line["total"]) >= 0
    assert record.levelno == logging.WARNING
    fields = getattr(record, FIELDS)  # what a JSON line carries beside the message
    assert fields["job_id"] == "end1" and fields["status"] == "failed"
    assert fields["error_code"] == "deadline_exceeded"


async def test_a_canceled_job_ends_at_info(store, caplog):
    await _job(store, "end2", total=1)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert await store.finalize("end2", JobStatus.CANCELED, [None])
    (record,) = _ends(caplog)
    assert record.levelno == logging.INFO
    line = LINE.match(record.getMessage())
    assert line and line["status"] == "canceled" and line["error"] is None


async def test_the_worker_that_stores_the_last_result_writes_the_line(store, caplog):
    await _job(store, "end3", total=1)
    sub = SubRequest(job_id="end3", index=0, model="tiny-gpt2",
                     item=TextItem(prompt="a", max_new_tokens=2))
    await store.acquire_lease(sub, "w1", 30, 3)  # the job starts
    result = SubResult(index=0, worker="w1",
                       output=GeneratedText(text="x", finish_reason="length", tokens=1))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        got = await store.store_last_result("end3", result, {"text": "x"}, model="tiny-gpt2")
        assert isinstance(got, Finished)
        # A duplicate of the result changes nothing, and says nothing.
        assert await store.store_last_result("end3", result, {"text": "x"}) == -2
        assert not await store.finalize("end3", JobStatus.CANCELED, [None])
    (record,) = _ends(caplog)
    line = LINE.match(record.getMessage())
    assert line and (line["id"], line["status"]) == ("end3", "succeeded")
    queued, running, total = (float(line[k]) for k in ("queued", "running", "total"))
    assert abs(queued + running - total) <= 0.002
    assert record.levelno == logging.INFO
