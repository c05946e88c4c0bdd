"""The line a worker writes when it stops a job's sub-requests says what the job became (past
its deadline, canceled, gone), once, on a real Redis channel (services/worker/cancellation.py)."""

import asyncio
import logging
import time

import pytest

from services.worker.cancellation import CancelListener
from services.worker.flights import Flights, InFlight
from shared import names
from shared.messages import CancelNotice, JobError, SubRequest, TextItem


def _flight(job_id: str) -> InFlight:
    sub = SubRequest(job_id=job_id, index=0, model="tiny-gpt2",
                     item=TextItem(prompt="a", max_new_tokens=2))
    return InFlight(sub, time.time() + 60)


@pytest.mark.parametrize(("record", "says"), [
    ({"status": "failed",
      "error": JobError(code="deadline_exceeded", message="past it").model_dump_json()},
     "status=failed error=deadline_exceeded"),
    ({"status": "canceled"}, "status=canceled"),
    (None, "status=gone"),
])
async def test_the_stop_line_says_why(aredis, caplog, record, says):
    job_id = f"why-{says.split()[0]}"
    if record is not None:
        await aredis.hset(names.job_key(job_id), mapping=record)
    flights = Flights()
    flight = _flight(job_id)
    flights.add(flight)
    listener = CancelListener(aredis, flights)
    task = asyncio.ensure_future(listener.run())
    try:
        with caplog.at_level(logging.INFO, logger="services.worker.cancellation"):
            async with asyncio.timeout(5):
                while (await aredis.pubsub_numsub(names.CANCEL_CHANNEL))[0][1] < 1:
                    await asyncio.sleep(0.01)
                await aredis.publish(names.CANCEL_CHANNEL, CancelNotice(job_id=job_id).encode())
                while "stopping" not in caplog.text:
                    await asyncio.sleep(0.01)
            # The next heartbeat's sweep finds the job final too: the stop is told once.
            await listener.sweep()
        assert flight.stop.is_set()
        assert f"stopping 1 sub-request(s) of job {job_id}: {says}" in caplog.text
        assert caplog.text.count("stopping") == 1, caplog.text
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
