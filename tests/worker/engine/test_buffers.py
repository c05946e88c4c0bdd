"""BufferPool: preallocated sets per bucket, leases returned on every exit, bounded ad-hoc sets."""

import asyncio

import pytest
import torch

from services.worker import metrics
from services.worker.engine.buffers import BufferPool, capacity


def adhoc(model):
    return metrics.BUFFER_LEASES.labels(model, "adhoc")._value.get()


def pooled(model):
    return metrics.BUFFER_LEASES.labels(model, "pooled")._value.get()


class Allocator:
    def __init__(self):
        self.calls = 0

    def __call__(self, key):
        self.calls += 1
        cap, n = key
        return {"x": torch.zeros(cap, n)}


def test_capacity_rounds_up_to_a_power_of_two():
    assert [capacity(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 4, 4, 8, 8, 16]
    with pytest.raises(ValueError):
        capacity(0)


def test_sets_are_preallocated_and_reused():
    alloc = Allocator()
    pool = BufferPool("pool-reuse", alloc, [(1, 4), (2, 4)], sets_per_bucket=2)
    assert alloc.calls == 4 and pool.pooled_sets == 4 and pool.free_sets == 4
    seen = set()
    for _ in range(10):
        with pool.lease((2, 4)) as bufs:
            seen.add(bufs["x"].data_ptr())
            assert pool.free_sets == 3
    assert alloc.calls == 4  # nothing allocated after start
    assert len(seen) <= 2
    assert adhoc("pool-reuse") == 0 and pooled("pool-reuse") == 10


def test_lease_is_returned_on_error():
    pool = BufferPool("pool-error", Allocator(), [(1, 4)], sets_per_bucket=1)
    with pytest.raises(RuntimeError), pool.lease((1, 4)):
        raise RuntimeError("operator failed")
    assert pool.free_sets == 1


def test_lease_is_returned_on_cancellation():
    pool = BufferPool("pool-cancel", Allocator(), [(1, 4)], sets_per_bucket=1)

    async def holder(started):
        with pool.lease((1, 4)):
            started.set()
            await asyncio.sleep(10)

    async def main():
        started = asyncio.Event()
        task = asyncio.create_task(holder(started))
        await started.wait()
        assert pool.free_sets == 0
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert pool.free_sets == 1


def test_empty_bucket_allocates_ad_hoc_and_frees_it():
    alloc = Allocator()
    pool = BufferPool("pool-adhoc", alloc, [(1, 4)], sets_per_bucket=1)
    with pool.lease((1, 4)), pool.lease((1, 4)) as extra:
        assert extra.adhoc and pool.adhoc_live == 1
    assert pool.adhoc_live == 0
    assert pool.free_sets == pool.pooled_sets == 1  # the pool did not grow
    with pool.lease((8, 4)) as other_shape:  # a bucket never configured
        assert other_shape.adhoc
    assert pool.pooled_sets == 1 and pool.adhoc_live == 0
    assert adhoc("pool-adhoc") == 2 and alloc.calls == 3


def test_failed_ad_hoc_allocation_leaves_no_trace():
    def fail(key):
        raise MemoryError("out of device memory")

    pool = BufferPool("pool-oom", fail, [], sets_per_bucket=1)
    with pytest.raises(MemoryError), pool.lease((1, 4)):
        pass
    assert pool.adhoc_live == 0


def test_free_sets_gauge_follows_leases():
    pool = BufferPool("pool-gauge", Allocator(), [(1, 4)], sets_per_bucket=3)
    gauge = metrics.BUFFER_FREE_SETS.labels("pool-gauge")
    assert gauge._value.get() == 3
    with pool.lease((1, 4)):
        assert gauge._value.get() == 2
    assert gauge._value.get() == 3
