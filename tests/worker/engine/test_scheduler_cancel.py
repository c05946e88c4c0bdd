"""A batch task cancelled mid-operator: a thread cannot be stopped, so the batch keeps its
buffers until the operator has really finished, and a set leased after the batch closed goes
straight back. The pool's promise must not depend on nobody cancelling."""

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from services.worker.engine.batch import Batch
from services.worker.engine.buffers import BufferPool
from services.worker.engine.graph import Graph
from services.worker.engine.operator import Operator
from services.worker.engine.router import END, JOIN, START, Router, Split
from services.worker.engine.scheduler import Scheduler
from services.worker.engine.stopped import PipelineStopped


class Step(Operator):
    def __init__(self, name, fn, executor="device", input_type=object, output_type=object):
        self.name, self.fn, self.executor = name, fn, executor
        self.input_type, self.output_type = input_type, output_type

    def run(self, value, batch):
        return self.fn(value, batch)


@pytest.fixture
def pool():
    return BufferPool("cancel-test", lambda key: {"buf": bytearray(8)}, [(1,)], sets_per_bucket=1)


def test_a_cancelled_batch_keeps_its_set_until_the_device_step_ends(pool):
    entered, release = threading.Event(), threading.Event()
    seen_free: list[int] = []

    def lease(items, batch):
        batch.hold(pool.lease((1,)))
        return items

    def slow(value, batch):
        entered.set()
        release.wait(5)
        seen_free.append(pool.free_sets)  # still ours while we run
        return value

    graph = Graph([Step("lease", lease, "cpu"), Step("slow", slow)],
                  Router({START: "lease", "lease": "slow", "slow": END}))
    device, cpu = ThreadPoolExecutor(1), ThreadPoolExecutor(1)
    scheduler = Scheduler(device, cpu)

    async def main():
        batch = Batch([1])

        async def run():
            try:
                return await scheduler.run_async(graph, [1], batch)
            finally:
                batch.close()

        task = asyncio.ensure_future(run())
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 5)
        task.cancel()
        await asyncio.sleep(0.05)
        assert not task.done()  # waiting for the operator, not handing its set back
        assert pool.free_sets == 0
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert seen_free == [0]
    assert pool.free_sets == pool.pooled_sets == 1


def test_a_failed_split_waits_for_its_siblings_before_the_batch_ends(pool):
    entered, release = threading.Event(), threading.Event()
    held: list[int] = []

    def per_item(value, batch):
        if value == 0:
            entered.wait(5)
            raise RuntimeError("one element fails")
        entered.set()
        release.wait(5)
        held.append(pool.free_sets)
        return value

    graph = Graph([Step("each", per_item, "cpu", input_type=int, output_type=int)],
                  Router({START: Split(each="each", then=END), "each": JOIN}))
    scheduler = Scheduler(ThreadPoolExecutor(1), ThreadPoolExecutor(2))

    async def main():
        batch = Batch([0, 1])
        batch.hold(pool.lease((1,)))
        task = asyncio.ensure_future(scheduler.run_async(graph, [0, 1], batch))
        await asyncio.sleep(0.1)
        assert not task.done()  # element 0 failed, element 1 still runs
        release.set()
        with pytest.raises(RuntimeError, match="one element fails"):
            await task
        batch.close()

    asyncio.run(main())
    assert held == [0]
    assert pool.free_sets == 1


def test_a_lease_taken_after_the_batch_closed_goes_straight_back(pool):
    batch = Batch([1])
    batch.close()
    with pytest.raises(PipelineStopped):
        batch.hold(pool.lease((1,)))
    assert pool.free_sets == 1 and pool.adhoc_live == 0
