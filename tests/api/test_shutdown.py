import asyncio
import logging

import pytest

from services.api import shutdown


async def _swallows_cancellation(release: asyncio.Event) -> None:
    while not release.is_set():
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            continue  # the defect being bounded: a loop that ignores its cancellation


async def test_a_loop_that_ignores_its_cancellation_is_left_behind_and_named(caplog):
    release = asyncio.Event()
    stuck = asyncio.create_task(_swallows_cancellation(release), name="stubborn")
    polite = asyncio.create_task(asyncio.sleep(3600), name="polite")
    await asyncio.sleep(0)  # both are waiting inside their sleep
    with caplog.at_level(logging.ERROR, logger=shutdown.__name__):
        await shutdown.stop_tasks([stuck, polite], seconds=0.2)
    assert polite.cancelled()
    assert not stuck.done()
    assert "the stubborn loop did not stop" in caplog.text
    assert "_swallows_cancellation" in caplog.text  # where it is stuck
    release.set()
    stuck.cancel()
    await asyncio.wait([stuck])


async def test_a_step_that_never_ends_is_abandoned_after_its_bound(caplog):
    never = asyncio.get_running_loop().create_future()
    with caplog.at_level(logging.ERROR, logger=shutdown.__name__):
        await shutdown.bounded("closing Redis", never, seconds=0.1)
    assert "closing Redis took longer than" in caplog.text


@pytest.mark.parametrize("takes", [0, 0.01])
async def test_a_step_that_ends_in_time_logs_nothing(caplog, takes):
    with caplog.at_level(logging.ERROR, logger=shutdown.__name__):
        await shutdown.bounded("closing Celery", asyncio.sleep(takes), seconds=1)
    assert caplog.text == ""
