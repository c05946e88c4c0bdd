"""The janitor: re-sends a sub-request whose lease expired or that was sent and never leased,
dead-letters one out of attempts, and loses nothing when it fails half-way."""

import asyncio
import base64
import json

from services.api.janitor import Janitor
from services.api.joiner import Joiner
from shared import names
from shared.job import DEFAULT_PRIORITY, JobStatus
from shared.jobstore import JobRecord, NewJob
from shared.messages import SubRequest
from shared.queue_depth import priority_lists


async def _queued(aredis, model: str) -> list[SubRequest]:
    """The sub-requests waiting in a model's Celery queue (kombu's JSON envelope)."""
    out = []
    raws = [r for key in priority_lists(model) for r in await aredis.lrange(key, 0, -1)]
    for raw in raws:
        message = json.loads(raw)
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        out.append(SubRequest.model_validate(args[0]))
    return out


async def _job(store):
    await store.create(NewJob("j1", "text-generation", "tiny-gpt2",
                              {"prompts": ["a", "b"], "seed": 5, "max_new_tokens": 3}, 2))
    await store.mark_dispatched("j1")


async def _queued_job(store, dispatcher, job_id: str, prompts: list[str]) -> None:
    """A job stored with its messages pushed onto its queue, as the API stores one."""
    inp = {"prompts": prompts}
    rec = JobRecord(job_id, "text-generation", "tiny-gpt2", JobStatus.QUEUED, inp, len(prompts),
                    0.0)
    await store.create(NewJob(job_id, "text-generation", "tiny-gpt2", inp, len(prompts)),
                       enqueue=dispatcher.messages(dispatcher.subrequests(rec)))


async def test_expired_lease_is_sent_again(store, aredis, dispatcher, settings, lifecycle):
    await _job(store)
    rec = await store.get("j1")
    sub = dispatcher.subrequests(rec)[1]
    await store.acquire_lease(sub, "dead-worker", lease_seconds=-1, max_attempts=2)
    janitor = Janitor(store, dispatcher, lifecycle, settings)
    assert await janitor.sweep() == 1
    queued = await _queued(aredis, "tiny-gpt2")
    assert len(queued) == 1
    resent = queued[0]
    assert (resent.job_id, resent.index, resent.item.prompt, resent.item.seed) == ("j1", 1, "b", 6)
    assert await janitor.sweep() == 0  # the lease was taken away once


async def test_sub_request_out_of_attempts_is_dead_lettered(
    store, aredis, dispatcher, settings, lifecycle
):
    await _job(store)
    sub = dispatcher.subrequests(await store.get("j1"))[0]
    for _ in range(settings.max_attempts):  # each time its worker was lost while running it
        await store.acquire_lease(sub, "w", lease_seconds=-1, max_attempts=settings.max_attempts)
        await store.charge_attempts([sub.member], "w")
        await store.claim_expired_leases()
    await store.acquire_lease(sub, "w", lease_seconds=-1, max_attempts=settings.max_attempts + 1)
    await aredis.lpush(names.DEAD_LETTER, "older", "old")  # letters of earlier sub-requests
    capped = settings.model_copy(update={"dead_letter_max": 2})
    janitor = Janitor(store, dispatcher, lifecycle, capped)
    assert await janitor.sweep() == 1
    assert await _queued(aredis, "tiny-gpt2") == []
    raw = await aredis.lrange(names.DEAD_LETTER, 0, -1)
    assert len(raw) == 2 and raw[1] == b"old"  # the newest two: this one, then the last one
    letter = json.loads(raw[0])
    assert (letter["job_id"], letter["index"], letter["model"]) == ("j1", 0, "tiny-gpt2")
    assert letter["attempts"] == settings.max_attempts and "attempts" in letter["reason"]
    assert letter["prompt_chars"] == len(sub.item.prompt) and "prompt" not in letter
    joiner = Joiner(aredis, lifecycle, settings, "api")
    await joiner.ensure_group()
    await joiner.reclaim()
    resp = await aredis.xreadgroup(names.JOINER_GROUP, "api", {names.COMPLETIONS_STREAM: ">"})
    await joiner._handle_batch(resp[0][1])
    rec = await store.get("j1")
    assert rec.status == "failed" and rec.error.code == "dead_lettered"


async def test_interrupted_dispatch_is_completed(store, aredis, dispatcher, settings, lifecycle):
    await store.create(NewJob("j2", "text-generation", "tiny-gpt2", {"prompts": ["a", "b", "c"]},
                              3))
    await aredis.zadd(names.DISPATCHING, {"j2": 0})  # its creator died long ago
    janitor = Janitor(store, dispatcher, lifecycle, settings)
    assert await janitor.sweep() == 3
    assert len(await _queued(aredis, "tiny-gpt2")) == 3


def _fast(settings):
    """Settings under which a sub-request unleased for 0.3 s counts as lost."""
    return settings.model_copy(update={"lost_subrequest_seconds": 0.3})


async def test_a_sub_request_sent_but_never_leased_is_sent_again_once(
    store, aredis, dispatcher, settings, lifecycle
):
    """A worker took both messages from the queue and was killed before leasing one of them:
    the messages are gone from the queue (the broker keeps no copy of a delivered message), and
    no lease says anyone runs them."""
    await _job(store)
    for key in priority_lists("tiny-gpt2"):
        await aredis.delete(key)
    rec = await store.get("j1")
    # Sub-request 0 was leased before the kill and is the lease sweep's; 1 was never leased.
    await store.acquire_lease(dispatcher.subrequests(rec)[0], "w", 30, 3)
    janitor = Janitor(store, dispatcher, lifecycle, _fast(settings))
    assert await janitor.sweep_orphans() == 0  # not yet: it may just have been taken
    await asyncio.sleep(0.4)
    assert await janitor.sweep_orphans() == 1
    assert [(s.job_id, s.index) for s in await _queued(aredis, "tiny-gpt2")] == [("j1", 1)]
    # Queued again, and sent just now: neither this sweep nor a second replica's sends it twice.
    other = Janitor(store, dispatcher, lifecycle, _fast(settings))
    assert await asyncio.gather(janitor.sweep_orphans(), other.sweep_orphans()) == [0, 0]
    await asyncio.sleep(0.4)
    assert await janitor.sweep_orphans() == 0  # still waiting in its queue: not lost
    assert len(await _queued(aredis, "tiny-gpt2")) == 1


async def test_a_sub_request_behind_the_queue_tail_is_lost_one_still_queued_is_not(
    store, aredis, dispatcher, settings, lifecycle
):
    """Queues are first in, first out: a sub-request sent before the oldest message still
    waiting was taken from the queue; unleased, it is lost, however deep the queue is."""
    await _queued_job(store, dispatcher, "j1", ["a", "b"])
    await asyncio.sleep(0.4)
    await _queued_job(store, dispatcher, "j2", ["c"])
    lists = priority_lists("tiny-gpt2")
    for _ in range(2):  # j1's two messages were taken by a worker that died
        await aredis.rpop(lists[DEFAULT_PRIORITY])
    assert len(await _queued(aredis, "tiny-gpt2")) == 1
    janitor = Janitor(store, dispatcher, lifecycle, _fast(settings))
    await asyncio.sleep(0.4)
    assert await janitor.sweep_orphans() == 2  # j2:0 still waits, and is not sent again
    queued = sorted((s.job_id, s.index) for s in await _queued(aredis, "tiny-gpt2"))
    assert queued == [("j1", 0), ("j1", 1), ("j2", 0)]


async def test_a_failed_send_loses_nothing(store, aredis, dispatcher, settings, lifecycle,
                                           monkeypatch):
    """Three expired leases, and the send of the first one fails: the other two go out in the
    same sweep, and the first once the orphan sweep finds it."""
    for job in ("a", "b", "c"):
        await store.create(NewJob(job, "text-generation", "tiny-gpt2", {"prompts": ["x"]}, 1))
        for key in priority_lists("tiny-gpt2"):
            await aredis.delete(key)
        sub = dispatcher.subrequests(await store.get(job))[0]
        await store.acquire_lease(sub, "dead", lease_seconds=-1, max_attempts=3)
    real_send, calls = dispatcher.send, []

    async def flaky_send(subs, priority=0):
        calls.append(subs)
        if len(calls) == 1:
            raise ConnectionError("broker away")
        await real_send(subs, priority)

    monkeypatch.setattr(dispatcher, "send", flaky_send)
    janitor = Janitor(store, dispatcher, lifecycle, _fast(settings))
    janitor._orphans_due = float("inf")
    assert await janitor.sweep() == 2
    assert len(await _queued(aredis, "tiny-gpt2")) == 2
    await asyncio.sleep(0.4)
    assert await janitor.sweep_orphans() == 1
    assert sorted(s.job_id for s in await _queued(aredis, "tiny-gpt2")) == ["a", "b", "c"]


async def test_what_ran_when_its_worker_was_lost_goes_out_isolated(
    store, aredis, dispatcher, settings, lifecycle
):
    await _job(store)
    for key in priority_lists("tiny-gpt2"):
        await aredis.delete(key)
    held, running = dispatcher.subrequests(await store.get("j1"))
    for sub in (held, running):
        await store.acquire_lease(sub, "lost", lease_seconds=-1, max_attempts=2)
    await store.charge_attempts([running.member], "lost")  # only this one had started
    assert await Janitor(store, dispatcher, lifecycle, settings).sweep() == 2
    resent = {s.index: s for s in await _queued(aredis, "tiny-gpt2")}
    assert (resent[0].isolated, resent[1].isolated) == (False, True)
    assert (await store.attempts("j1", 0), await store.attempts("j1", 1)) == (0, 1)


async def test_a_deadline_whose_expiry_failed_is_taken_again(store, aredis, dispatcher,
                                                             settings, lifecycle, monkeypatch):
    from shared.job import JobMeta
    from shared.jobstore import RETRY_CLAIM_SECONDS

    await store.create(NewJob("d1", "text-generation", "tiny-gpt2", {"prompts": ["x"]}, 1,
                              JobMeta(deadline_seconds=0.01)))
    await asyncio.sleep(0.05)

    async def broken(job_id):
        raise ConnectionError("Redis away")

    monkeypatch.setattr(lifecycle, "expire", broken)
    janitor = Janitor(store, dispatcher, lifecycle, settings)
    janitor._orphans_due = float("inf")
    assert await janitor.sweep() == 0
    due = await aredis.zscore(names.DEADLINES, "d1")
    assert due is not None  # still listed, due again later
    await aredis.zadd(names.DEADLINES, {"d1": due - RETRY_CLAIM_SECONDS})
    monkeypatch.undo()
    assert await janitor.sweep() == 1
    rec = await store.get("d1")
    assert rec.status == "failed" and rec.error.code == "deadline_exceeded"
    assert await aredis.zscore(names.DEADLINES, "d1") is None


async def test_a_lease_being_recovered_is_not_also_sent_by_the_orphan_sweep(
    store, aredis, dispatcher, settings, lifecycle
):
    """One replica takes an expired lease over and is about to send it again; another
    replica's orphan sweep must not send it as well (then its FIFO reasoning would see
    duplicates as lost work and cascade)."""
    await _job(store)
    sub = dispatcher.subrequests(await store.get("j1"))[0]
    await store.acquire_lease(sub, "dead", lease_seconds=-1, max_attempts=3)
    await asyncio.sleep(0.4)
    assert await store.claim_expired_leases("janitor:a", 30) == [("j1", 0)]  # mid-recovery
    other = Janitor(store, dispatcher, lifecycle, _fast(settings))
    assert await other.sweep_orphans() == 1  # j1:1 was never leased: lost; j1:0 is held
    assert [(s.job_id, s.index) for s in await _queued(aredis, "tiny-gpt2")] == [("j1", 1)]
    # The delivery the recovering janitor sends takes its lease at once.
    assert (await store.acquire_lease(sub, "w2", 30, 3)).outcome == "acquired"
