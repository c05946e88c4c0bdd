"""The worker's listener for cancel notices and watched jobs (services/worker/cancellation.py),
on a real Redis channel."""

import asyncio
import time

from services.worker.cancellation import CancelListener
from services.worker.flights import Flights, InFlight
from shared import names
from shared.messages import CancelNotice, SubRequest, TextItem


def _flight(job_id: str) -> InFlight:
    sub = SubRequest(job_id=job_id, index=0, model="tiny-gpt2",
                     item=TextItem(prompt="a", max_new_tokens=2))
    flight = InFlight(sub, time.time() + 60)
    flight.watched = False
    return flight


async def _until(check, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


async def test_a_watched_job_publishes_and_a_canceled_one_stops(aredis):
    flights = Flights()
    watched, other = _flight("j1"), _flight("j2")
    flights.add(watched)
    flights.add(other)
    task = asyncio.ensure_future(CancelListener(aredis, flights).run())
    try:
        async with asyncio.timeout(5):
            while (await aredis.pubsub_numsub(names.WATCH_CHANNEL))[0][1] < 1:
                await asyncio.sleep(0.01)
        await aredis.publish(names.WATCH_CHANNEL, "j1")
        await _until(lambda: watched.watched)
        assert not other.watched and not watched.stop.is_set()
        await aredis.publish(names.CANCEL_CHANNEL, CancelNotice(job_id="j2").encode())
        await _until(other.stop.is_set)
        assert not other.watched and not watched.stop.is_set()
    finally:
        task.cancel()
