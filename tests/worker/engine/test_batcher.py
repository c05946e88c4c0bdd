"""The dynamic batcher: full batches, bounded waits, no wait when nothing else is coming."""

import asyncio
import time

import pytest

from services.worker.engine.batcher import Batcher
from services.worker.engine.scheduling import Ticket
from services.worker.engine.stopped import PipelineStopped


class Recorder:
    def __init__(self, delay=0.0, fail_on=None):
        self.batches = []
        self.delay = delay
        self.fail_on = fail_on

    async def __call__(self, group):
        self.batches.append([p.item for p in group])
        await asyncio.sleep(self.delay)
        for p in group:
            if self.fail_on is not None and self.fail_on in [q.item for q in group]:
                p.future.set_exception(RuntimeError("batch failed"))
            else:
                p.future.set_result(p.item * 10)


def test_a_lone_item_runs_at_once_when_nothing_else_is_expected():
    rec = Recorder()

    async def main():
        b = Batcher(rec, max_batch=8, max_wait_s=5.0)
        t0 = time.monotonic()
        assert await b.submit(1) == 10
        return time.monotonic() - t0

    assert asyncio.run(main()) < 1.0  # far below max_wait
    assert rec.batches == [[1]]


def test_expected_items_are_waited_for_and_batched():
    rec = Recorder()

    async def main():
        b = Batcher(rec, max_batch=8, max_wait_s=5.0)
        b.expected = 3
        futures = []
        for i in range(4):
            if i:
                b.expected -= 1
            futures.append(b.submit(i))
            await asyncio.sleep(0.01)
        return await asyncio.gather(*futures)

    assert asyncio.run(main()) == [0, 10, 20, 30]
    assert rec.batches == [[0, 1, 2, 3]]


def test_wait_is_bounded_by_max_wait():
    rec = Recorder()

    async def main():
        b = Batcher(rec, max_batch=8, max_wait_s=0.05)
        b.expected = 5  # announced but never submitted
        t0 = time.monotonic()
        await b.submit(1)
        return time.monotonic() - t0

    waited = asyncio.run(main())
    assert 0.04 <= waited < 1.0
    assert rec.batches == [[1]]


def test_an_idle_batcher_with_linger_waits_while_items_keep_coming():
    rec = Recorder()

    async def main():
        b = Batcher(rec, max_batch=8, max_wait_s=5.0, linger_s=0.1)
        futures = []
        for i in range(3):  # nothing announced: each arrival is a surprise
            futures.append(b.submit(i))
            await asyncio.sleep(0.03)  # within linger of the one before
        assert rec.batches == []
        return await asyncio.gather(*futures)

    assert asyncio.run(main()) == [0, 10, 20]
    assert rec.batches == [[0, 1, 2]]


def test_a_gap_longer_than_linger_starts_the_batch():
    rec = Recorder(delay=0.2)

    async def main():
        b = Batcher(rec, max_batch=8, max_wait_s=5.0, max_running=1, linger_s=0.02)
        first = b.submit(0)
        await asyncio.sleep(0.1)  # past linger: the first has left alone
        assert rec.batches == [[0]]
        return await asyncio.gather(first, b.submit(1))

    assert asyncio.run(main()) == [0, 10]
    assert rec.batches == [[0], [1]]


def test_linger_is_bounded_by_max_wait_from_the_oldest():
    rec = Recorder()

    async def main():
        b = Batcher(rec, max_batch=100, max_wait_s=0.1, linger_s=0.05)
        futures = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.4:  # an arrival every 10 ms, for 0.4 s
            futures.append(b.submit(len(futures)))
            await asyncio.sleep(0.01)
        await asyncio.gather(*futures)

    asyncio.run(main())
    assert len(rec.batches) >= 2  # the first left at max_wait, with arrivals still coming
    assert sorted(i for batch in rec.batches for i in batch) == list(range(
        sum(len(batch) for batch in rec.batches)))


def test_linger_never_holds_a_full_group():
    rec = Recorder()

    async def main():
        b = Batcher(rec, max_batch=2, max_wait_s=5.0, linger_s=5.0)
        t0 = time.monotonic()
        await asyncio.gather(b.submit(0), b.submit(1))
        return time.monotonic() - t0

    assert asyncio.run(main()) < 1.0
    assert rec.batches == [[0, 1]]


def test_batches_are_capped_at_max_batch_and_grouped_by_key():
    rec = Recorder(delay=0.05)

    async def main():
        b = Batcher(rec, max_batch=3, max_wait_s=0.01, max_running=1,
                    key=lambda i: "a" if i % 2 else "b")
        b.expected = 100
        futures = [b.submit(i) for i in range(8)]
        b.expected = 0
        b.pump()
        return await asyncio.gather(*futures)

    assert asyncio.run(main()) == [i * 10 for i in range(8)]
    assert all(len(batch) <= 3 for batch in rec.batches)
    for batch in rec.batches:
        assert len({i % 2 for i in batch}) == 1  # one key per batch
    assert sorted(i for batch in rec.batches for i in batch) == list(range(8))


def test_a_failing_batch_fails_its_own_items_and_the_batcher_goes_on():
    rec = Recorder(fail_on=2)

    async def main():
        b = Batcher(rec, max_batch=2, max_wait_s=0.01, max_running=1)
        b.expected = 1
        first = [b.submit(1)]
        b.expected = 0
        first.append(b.submit(2))
        results = await asyncio.gather(*first, return_exceptions=True)
        later = await b.submit(3)
        return results, later

    results, later = asyncio.run(main())
    assert all(isinstance(r, RuntimeError) for r in results)
    assert later == 30


def test_a_runner_that_raises_still_settles_its_items():
    async def broken(group):
        raise RuntimeError("runner bug")

    async def main():
        b = Batcher(broken, max_batch=4, max_wait_s=0.01)
        with pytest.raises(RuntimeError, match="runner bug"):
            await b.submit(1)
        return b.running

    assert asyncio.run(main()) == 0


def test_a_partial_group_fills_up_while_a_batch_runs():
    rec = Recorder(delay=0.1)

    async def main():
        b = Batcher(rec, max_batch=8, max_wait_s=0.001)
        first = b.submit(0)  # idle engine, nothing expected: runs at once, alone
        await asyncio.sleep(0.01)
        later = [b.submit(i) for i in range(1, 5)]  # arrive while it runs
        await asyncio.sleep(0.03)
        assert b.running == 1  # not dispatched as batches of one beside the running batch
        return await asyncio.gather(first, *later)

    assert asyncio.run(main()) == [0, 10, 20, 30, 40]
    assert rec.batches == [[0], [1, 2, 3, 4]]


def test_full_groups_run_beside_a_running_batch():
    rec = Recorder(delay=0.1)

    async def main():
        b = Batcher(rec, max_batch=2, max_wait_s=0.001, max_running=2)
        futures = [b.submit(0)]
        await asyncio.sleep(0.01)
        futures += [b.submit(1), b.submit(2)]  # a full group: second slot
        await asyncio.sleep(0.01)
        assert b.running == 2
        return await asyncio.gather(*futures)

    assert asyncio.run(main()) == [0, 10, 20]
    assert rec.batches == [[0], [1, 2]]


def test_a_full_group_leaves_before_an_older_partial_one():
    rec = Recorder(delay=0.05)

    async def main():
        keys = {0: "a", 1: "b", 2: "c", 3: "c"}
        b = Batcher(rec, max_batch=2, max_wait_s=5.0, max_running=1, key=keys.__getitem__)
        first = b.submit(0)  # runs alone at once: nothing else expected
        await asyncio.sleep(0.01)
        futures = [b.submit(1), b.submit(2), b.submit(3)]
        await asyncio.gather(first, *futures)

    asyncio.run(main())
    # "b" is older, but "c" is full: it goes first, then "b" alone.
    assert rec.batches == [[0], [2, 3], [1]]


def test_a_withdrawn_item_leaves_the_queue_at_once():
    rec = Recorder(delay=0.2)
    withdrawn = {"flag": False}

    async def main():
        b = Batcher(rec, max_batch=8, max_wait_s=5.0, max_running=1)
        running = b.submit(0)  # keeps the batcher busy
        await asyncio.sleep(0.01)
        queued = b.submit(1, Ticket(withdrawn=lambda: withdrawn["flag"]))
        stays = b.submit(2)
        withdrawn["flag"] = True
        t0 = time.monotonic()
        b.pump()  # as the worker does when a held sub-request is stopped
        with pytest.raises(PipelineStopped):
            await queued
        waited = time.monotonic() - t0
        return waited, await running, await stays

    waited, first, other = asyncio.run(main())
    assert waited < 0.1  # not after the running batch
    assert (first, other) == (0, 20)
    assert rec.batches == [[0], [2]]


def test_an_isolated_item_runs_alone_with_nothing_beside_it():
    """A sub-request that was on the device when a worker was lost: a batch of one, started only
    once no other batch runs, and nothing starts beside it."""
    spans = []

    async def run(group):
        t0 = time.monotonic()
        await asyncio.sleep(0.05)
        spans.append(([p.item for p in group], t0, time.monotonic()))
        for p in group:
            p.future.set_result(p.item)

    async def main():
        b = Batcher(run, max_batch=4, max_wait_s=0.0, max_running=2)
        first = [b.submit(i) for i in range(4)]  # a full batch, running
        isolated = b.submit(9, Ticket(isolate=True))
        later = [b.submit(i) for i in range(10, 14)]  # would run beside it
        return await asyncio.gather(*first, isolated, *later)

    asyncio.run(main())
    by_items = {tuple(items): (t0, t1) for items, t0, t1 in spans}
    assert (9,) in by_items
    t0, t1 = by_items[(9,)]
    for items, (s0, s1) in by_items.items():
        if items != (9,):
            assert s1 <= t0 or s0 >= t1, f"{items} overlapped the isolated item"
