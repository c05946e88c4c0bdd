"""The job store on a real Redis: atomic transitions, write-once results, leases."""

import asyncio
import time

import pytest

from shared import names
from shared.errors import JobNotFound
from shared.failures import dead_lettered
from shared.job import JobStatus
from shared.jobstore import RAN_TTL_SECONDS, Finished, JobStore, NewJob
from shared.messages import DeadLetter, GeneratedText, SubRequest, SubResult, TextItem

FINALS = [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED]


def _text(text: str) -> GeneratedText:
    return GeneratedText(text=text, finish_reason="length", tokens=1)


async def _job(store: JobStore, job_id: str = "j1", total: int = 3):
    return await store.create(NewJob(job_id, "text-generation", "tiny-gpt2", {"prompts": ["a"]},
                                     total))


def _sub(job_id: str = "j1", index: int = 0) -> SubRequest:
    return SubRequest(job_id=job_id, index=index, model="tiny-gpt2",
                      item=TextItem(prompt="a", max_new_tokens=2))


async def test_create_and_read_back(store):
    await _job(store)
    rec = await store.get("j1")
    assert (rec.status, rec.total, rec.done, rec.input) == ("queued", 3, 0, {"prompts": ["a"]})
    with pytest.raises(JobNotFound):
        await store.get("nope")


async def test_the_first_lease_starts_the_job_once(store):
    await _job(store)
    await store.acquire_lease(_sub(index=0), "w1", 30, 3)
    started = (await store.get("j1")).started_at
    await store.acquire_lease(_sub(index=1), "w2", 30, 3)
    rec = await store.get("j1")
    assert rec.status == JobStatus.RUNNING and rec.started_at == started is not None


@pytest.mark.parametrize("final", FINALS)
async def test_final_state_is_never_left(store, final):
    await _job(store)
    assert await store.finalize("j1", final, [None, None, None])
    # Every script that changes a job refuses a final one.
    assert (await store.acquire_lease(_sub(), "w1", 30, 3)).outcome == "final"
    assert await store.store_result("j1", SubResult(index=0, output=None)) == -2
    for to in FINALS:
        assert not await store.finalize("j1", to, [{"text": "x"}])
    rec = await store.get("j1")
    assert rec.status == final and rec.output == [None, None, None]


async def test_concurrent_finalize_has_one_winner(store):
    await _job(store)
    wins = await asyncio.gather(*[
        store.finalize("j1", FINALS[i % 3], [None]) for i in range(30)
    ])
    assert sum(wins) == 1


async def test_a_finished_job_keeps_its_record_for_the_ttl_and_drops_what_ran_it(store,
                                                                                  aredis):
    """Redis holds what is live: the record (with every output, and the attempts its
    sub-requests were charged) stays for the finished TTL; the sub-results, needed only while
    the job ran, go within minutes."""
    await _job(store)
    sub = _sub()
    await store.acquire_lease(sub, "w1", 30, 3)
    await store.charge_attempts([sub.member], "w1")
    await store.store_result("j1", SubResult(index=0, output=_text("x")))
    await store.finalize("j1", JobStatus.SUCCEEDED, [{"text": "x"}])
    assert 0 < await aredis.ttl(names.job_key("j1")) <= 3600
    assert (await store.get("j1")).output == [{"text": "x"}]
    assert 0 < await aredis.ttl(names.results_key("j1")) <= RAN_TTL_SECONDS
    assert await store.attempts("j1", 0) == 1
    assert not await aredis.exists(names.attempts_key("j1"))


@pytest.mark.parametrize("finish", ["finalize", "last_result"])
async def test_an_older_apis_job_has_its_attempts_hash_expired_when_it_ends(store, aredis,
                                                                            finish):
    """A job stored by an older API (no `r` in its `fin`) may have an attempts hash of its
    own, charged by an older worker: it gets the short TTL when the job ends, either way."""
    await _job(store, total=1)
    await aredis.hset(names.job_key("j1"), "fin", "")
    await aredis.hset(names.attempts_key("j1"), "0", 1)
    if finish == "finalize":
        await store.store_result("j1", SubResult(index=0, output=_text("x")))
        await store.finalize("j1", JobStatus.SUCCEEDED, [{"text": "x"}])
    else:
        got = await store.store_last_result("j1", SubResult(index=0, output=_text("x")),
                                            {"text": "x"})
        assert isinstance(got, Finished)
    assert 0 < await aredis.ttl(names.attempts_key("j1")) <= RAN_TTL_SECONDS


async def test_a_final_jobs_late_sub_request_leaves_nothing_behind(store, aredis):
    """A worker still running a sub-request of a job that failed fast or was canceled: its
    attempt and its result are refused, so no key without a TTL is made again."""
    await _job(store, total=2)
    sub = _sub()
    await store.acquire_lease(sub, "w1", 30, 3)
    await store.finalize("j1", JobStatus.CANCELED, [None, None])
    await aredis.delete(names.results_key("j1"))  # expired
    assert await store.charge_attempts([sub.member], "w1") == 0
    assert await store.attempts("j1", 0) == 0
    assert await store.store_result("j1", SubResult(index=0, output=_text("late"),
                                                    worker="w1")) == -2
    assert not await aredis.exists(names.results_key("j1"))
    assert await aredis.ttl(names.job_key("j1")) > 0
    # Its lease went with the refused result.
    assert await aredis.zscore(names.LEASES, sub.member) is None
    assert await store.lease_owner("j1", 0) is None


async def test_a_gone_jobs_record_is_never_made_again(store, aredis):
    """Leases and attempts live in the job's record: once the record expired, no charge,
    renewal, hand-back, claim or result makes it again, and its lease is dropped."""
    await _job(store)
    sub = _sub()
    await store.acquire_lease(sub, "w1", 0.05, 3)
    await aredis.delete(names.job_key("j1"))  # expired
    assert await store.charge_attempts([sub.member], "w1") == 0
    assert await store.renew_leases([sub.member], "w1", 30) == 0
    assert not await store.hand_back_lease(sub, "w1", "w1#handback", charged=False)
    await asyncio.sleep(0.1)
    assert await store.claim_expired_leases("janitor:x") == []
    assert await aredis.zscore(names.LEASES, sub.member) is None
    assert await store.store_result("j1", SubResult(index=0, output=_text("x"),
                                                    worker="w1")) == -1
    assert not await aredis.exists(names.job_key("j1"))


async def test_concurrent_duplicate_results_are_written_once(store, aredis):
    await _job(store, total=4)
    writes = []
    for index in range(4):
        for copy in range(10):  # ten deliveries of each index, with different payloads
            r = SubResult(index=index, output=_text(f"{index}-{copy}"), worker=f"w{copy}",
                          blob=f"outputs/j1/{index}-{copy}.png")
            writes.append(store.store_result("j1", r))
    outcomes = await asyncio.gather(*writes)
    assert outcomes.count(1) == 4 and outcomes.count(0) == 36
    results = await store.results("j1")
    assert sorted(results) == [0, 1, 2, 3]
    for index, r in results.items():
        copy = r.worker[1:]
        assert r.output == _text(f"{index}-{copy}")
        assert r.blob == f"outputs/j1/{index}-{copy}.png"  # the winner's reference, whole
    assert (await store.get("j1")).done == 4
    assert await aredis.xlen(names.COMPLETIONS_STREAM) == 4  # one completion per index


async def test_a_results_event_is_published_with_it_and_only_with_its_first_write(
    store, aredis
):
    await _job(store, total=2)
    pubsub = aredis.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(names.events_channel("j1"))
    assert await store.watch("j1")
    try:
        assert await store.store_result("j1", SubResult(index=0, output=_text("a")),
                                        event="first") == 1
        assert await store.store_result("j1", SubResult(index=0, output=_text("a")),
                                        event="again") == 0  # a duplicate: nothing published
        assert await store.store_result("j1", SubResult(index=1, output=_text("b"))) == 1
        heard = []
        deadline = time.monotonic() + 0.5
        while (left := deadline - time.monotonic()) > 0:
            if (msg := await pubsub.get_message(timeout=left)) is not None:
                heard.append(msg["data"])
    finally:
        await pubsub.aclose()
    assert heard == [b"first"]


async def test_result_refused_once_job_is_final(store):
    await _job(store)
    await store.finalize("j1", JobStatus.CANCELED, [None, None, None])
    assert await store.store_result("j1", SubResult(index=0, output=_text("late"))) == -2
    assert await store.results("j1") == {}


async def test_lease_lifecycle(store):
    await _job(store)
    sub = _sub()
    grant = await store.acquire_lease(sub, "w1", lease_seconds=30, max_attempts=3)
    assert (grant.outcome, grant.attempt) == ("acquired", 1)
    assert (await store.get("j1")).status == JobStatus.RUNNING
    # another worker cannot take a live lease
    assert (await store.acquire_lease(sub, "w2", 30, 3)).outcome == "busy"
    assert await store.renew_leases([sub.member], "w1", 30) == 1
    assert await store.renew_leases([sub.member], "w2", 30) == 0
    await store.store_result("j1", SubResult(index=0, output=_text("x"), worker="w1"))
    assert (await store.acquire_lease(sub, "w2", 30, 3)).outcome == "done"


async def test_expired_lease_is_claimed_once_and_counts_attempts(store):
    await _job(store)
    sub = _sub()
    for attempt in (1, 2, 3):
        grant = await store.acquire_lease(sub, f"w{attempt}", lease_seconds=-1, max_attempts=3)
        assert (grant.outcome, grant.attempt) == ("acquired", attempt)
        assert await store.charge_attempts([sub.member], f"w{attempt}") == 1  # it started
        claims = await asyncio.gather(*[store.claim_expired_leases() for _ in range(5)])
        assert sum(len(c) for c in claims) == 1
    assert await store.attempts("j1", 0) == 3
    assert (await store.acquire_lease(sub, "w4", 30, 3)).outcome == "exhausted"


async def test_a_lease_lost_before_its_sub_request_started_costs_no_attempt(store):
    await _job(store)
    sub = _sub()
    for attempt in range(5):  # five workers lost while only holding it
        grant = await store.acquire_lease(sub, f"w{attempt}", lease_seconds=-1, max_attempts=3)
        assert grant.outcome == "acquired"
        assert await store.claim_expired_leases() == [("j1", 0)]
    assert await store.attempts("j1", 0) == 0
    # Only the worker holding the lease charges it.
    await store.acquire_lease(sub, "w9", lease_seconds=30, max_attempts=3)
    assert await store.charge_attempts([sub.member], "someone-else") == 0
    assert await store.charge_attempts([sub.member], "w9") == 1
    assert await store.attempts("j1", 0) == 1


async def test_a_lease_taken_to_start_at_once_is_charged_in_the_same_step(store):
    """A worker whose engine has room asks for the charge with the lease: the attempt counts
    as the lease is granted (on the job's first start and on a later one), and runs out."""
    await _job(store, total=2)
    first, second = _sub("j1", 0), _sub("j1", 1)
    grant = await store.acquire_lease(first, "w1", lease_seconds=-1, max_attempts=2,
                                      charge=True)
    assert (grant.outcome, grant.attempt, grant.charged) == ("acquired", 1, True)
    assert (await store.get("j1")).status == JobStatus.RUNNING
    assert await store.attempts("j1", 0) == 1
    assert await store.lease_owner("j1", 0) == "w1"
    # Without the charge, the lease costs nothing; a lease that is not granted charges nothing.
    plain = await store.acquire_lease(second, "w2", 30, 2)
    assert (plain.outcome, plain.charged) == ("acquired", False)
    assert await store.attempts("j1", 1) == 0
    refused = await store.acquire_lease(second, "w3", 30, 2, charge=True)
    assert (refused.outcome, refused.charged) == ("busy", False)
    assert await store.attempts("j1", 1) == 0
    # Lost with it: the next delivery is its second attempt, and there is no third.
    assert await store.claim_expired_leases() == [("j1", 0)]
    again = await store.acquire_lease(first, "w4", lease_seconds=-1, max_attempts=2,
                                      charge=True)
    assert (again.outcome, again.attempt, again.charged) == ("acquired", 2, True)
    assert await store.attempts("j1", 0) == 2
    assert await store.claim_expired_leases() == [("j1", 0)]
    assert (await store.acquire_lease(first, "w5", 30, 2, charge=True)).outcome == "exhausted"
    assert await store.attempts("j1", 0) == 2


async def test_leases_run_on_the_redis_servers_clock(store, monkeypatch):
    """A worker whose clock is an hour slow still holds a live lease: expiry is decided with
    the Redis server's time, never a caller's."""
    await _job(store)
    sub = _sub()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 3600)
    assert (await store.acquire_lease(sub, "w1", lease_seconds=30, max_attempts=3)).outcome \
        == "acquired"
    assert await store.renew_leases([sub.member], "w1", 30) == 1
    monkeypatch.setattr(time, "time", lambda: real() + 3600)  # the janitor's runs fast
    assert await store.claim_expired_leases() == []


async def test_a_sweep_over_live_leases_reads_none_of_them(store, aredis):
    """The janitor sweeps every second: live leases, however many, cost it nothing per lease
    (only the expired ones are told to the script that takes them)."""
    await _job(store, total=20)
    for i in range(20):
        await store.acquire_lease(_sub(index=i), "w1", 30, 3)
    assert await store.claim_expired_leases() == []  # its script loaded: counted once below
    await aredis.config_resetstat()
    assert await store.claim_expired_leases() == []
    stats = await aredis.info("commandstats")
    assert "cmdstat_zscore" not in stats and "cmdstat_hset" not in stats
    assert stats["cmdstat_evalsha"]["calls"] == 1


async def test_lease_refused_for_final_job(store):
    await _job(store)
    await store.finalize("j1", JobStatus.CANCELED, [None] * 3)
    assert (await store.acquire_lease(_sub(), "w1", 30, 3)).outcome == "final"
    assert (await store.acquire_lease(_sub("zz"), "w1", 30, 3)).outcome == "gone"


async def test_stale_dispatch_is_claimed(store):
    await _job(store)
    assert await store.claim_stale_dispatches(older_than=3600) == []
    assert await store.claim_stale_dispatches(older_than=-1) == ["j1"]
    # Taken by one caller; listed until it is marked dispatched, due again only later.
    assert await store.claim_stale_dispatches(older_than=-1) == []
    assert await store.redis.zscore(names.DISPATCHING, "j1") is not None
    await store.mark_dispatched("j1")
    await _job(store, "j2")
    await store.mark_dispatched("j2")
    assert await store.claim_stale_dispatches(older_than=-1) == []


# What a job costs in Redis --------------------------------------------------------------------


async def _heard(pubsub, seconds: float = 0.3) -> list[tuple[bytes, bytes]]:
    """The messages a subscription got within `seconds`, subscribe confirmations left out."""
    out = []
    deadline = asyncio.get_running_loop().time() + seconds
    while (left := deadline - asyncio.get_running_loop().time()) > 0:
        msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=left)
        if msg is not None:
            out.append((msg["channel"], msg["data"]))
    await pubsub.aclose()
    return out


async def _calls(aredis) -> int:
    stats = await aredis.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k not in ("cmdstat_info",
                                                                 "cmdstat_config|resetstat"))


async def test_reading_a_job_is_one_command(store, aredis):
    from shared.job import JobMeta

    await _job(store)
    await aredis.config_resetstat()
    rec = await store.get("j1")
    assert await _calls(aredis) == 1 and rec.webhook_deliveries == []
    # A job with a webhook also has its delivery attempts read.
    await store.create(NewJob("j2", "text-generation", "tiny-gpt2", {"prompts": ["a"]}, 1,
                              JobMeta(webhook="https://example.com/h")))
    await aredis.config_resetstat()
    await store.get("j2")
    assert await _calls(aredis) == 2


async def test_a_job_stored_before_it_counted_its_results_is_read_in_full(store, aredis):
    await _job(store)
    await store.store_result("j1", SubResult(index=1, output=_text("x")))
    await aredis.hdel(names.job_key("j1"), "done")  # as an older API stored it
    assert (await store.get("j1")).done == 1


async def test_done_counts_the_results_and_the_store_releases_the_lease(store, aredis):
    await _job(store)
    sub = _sub(index=2)
    await store.acquire_lease(sub, "w1", 30, 3)
    assert await aredis.zscore(names.LEASES, sub.member) is not None
    r = SubResult(index=2, output=_text("x"), worker="w1")
    assert await store.store_result("j1", r, model="tiny-gpt2") == 1
    assert await aredis.zscore(names.LEASES, sub.member) is None
    assert await store.lease_owner("j1", sub.index) is None
    assert (await store.get("j1")).done == 1
    rec, results = await store.get_with_results("j1")
    assert rec.done == 1 and list(results) == [2] and results[2].output == _text("x")
    # Another worker's lease is left alone.
    await store.acquire_lease(_sub(index=0), "w2", 30, 3)
    await store.store_result("j1", SubResult(index=0, output=_text("y"), worker="w1"))
    assert await store.lease_owner("j1", 0) == "w2"


async def test_the_first_start_is_an_event_and_an_entry_only_for_a_start_webhook(store, aredis):
    from shared.job import JobMeta
    from shared.messages import StatusEvent, decode_event

    pubsub = aredis.pubsub()
    await pubsub.subscribe(names.events_channel("j1"), names.events_channel("j2"))
    await _job(store, "j1")
    await store.create(NewJob("j2", "text-generation", "tiny-gpt2", {"prompts": ["a"]}, 1,
                              JobMeta(webhook="https://example.com/h",
                                      webhook_events_filter=["start"]), watched=True))
    assert await store.watch("j1")
    for job_id in ("j1", "j2"):
        await store.acquire_lease(_sub(job_id, 0), "w1", 30, 3)
        await store.acquire_lease(_sub(job_id, 1), "w1", 30, 3)  # not the first: no event
    events = [(channel, decode_event(data)) for channel, data in await _heard(pubsub)]
    assert events == [
        (names.events_channel(j).encode(),
         StatusEvent(data={"id": j, "status": "running"})) for j in ("j1", "j2")
    ]
    entries = await aredis.xrange(names.COMPLETIONS_STREAM)
    assert [(f[b"job"], f[b"kind"]) for _id, f in entries] == [(b"j2", b"started")]


async def test_a_job_nobody_watches_has_no_events_published(store, aredis):
    """Live events are made for a live stream: a job none watches gets none from the scripts
    (its final channel message still goes out: waiters hear that)."""
    pubsub = aredis.pubsub()
    await pubsub.subscribe(names.events_channel("j1"), names.FINAL_CHANNEL)
    await _job(store, total=1)
    grant = await store.acquire_lease(_sub(), "w1", 30, 3)
    assert grant.outcome == "acquired" and not grant.watched
    got = await store.store_last_result("j1", SubResult(index=0, output=_text("x"),
                                                        worker="w1"), ONE_OUTPUT, event="last")
    assert isinstance(got, Finished)
    assert await _heard(pubsub) == [(names.FINAL_CHANNEL.encode(), b"j1")]


async def test_watching_a_running_job_publishes_its_events_from_then_on(store, aredis):
    """A stream that opens while the job runs: the workers are told on the watch channel, and
    the scripts publish what follows (the first start is past; the last output is not)."""
    pubsub = aredis.pubsub()
    await pubsub.subscribe(names.events_channel("j1"), names.WATCH_CHANNEL)
    await _job(store, total=2)
    assert not (await store.acquire_lease(_sub(index=0), "w1", 30, 3)).watched
    assert await store.watch("j1")
    assert (await store.acquire_lease(_sub(index=1), "w1", 30, 3)).watched
    assert await store.store_result("j1", SubResult(index=0, output=_text("x"), worker="w1"),
                                    event="out-0") == 1
    assert await _heard(pubsub) == [(names.WATCH_CHANNEL.encode(), b"j1"),
                                    (names.events_channel("j1").encode(), b"out-0")]


async def test_a_final_or_gone_job_is_not_watched(store, aredis):
    await _job(store)
    await store.finalize("j1", JobStatus.CANCELED, [None] * 3)
    assert not await store.watch("j1")
    assert not await store.watch("nope")
    assert await aredis.hget(names.job_key("j1"), "watch") is None
    assert not await aredis.exists(names.job_key("nope"))


async def test_an_older_apis_job_always_has_its_events_published(store, aredis):
    """Its streams, on replicas of that older API, never say they watch it."""
    pubsub = aredis.pubsub()
    await pubsub.subscribe(names.events_channel("j1"))
    await _job(store, total=1)
    await aredis.hset(names.job_key("j1"), "fin", "")
    assert (await store.acquire_lease(_sub(), "w1", 30, 3)).watched
    await store.store_last_result("j1", SubResult(index=0, output=_text("x"), worker="w1"),
                                  ONE_OUTPUT, event="last")
    heard = [data for _channel, data in await _heard(pubsub)]
    assert len(heard) == 2 and heard[1] == b"last"  # the running status, then the output


@pytest.mark.parametrize("final", FINALS)
async def test_finalize_announces_the_job_and_returns_it_as_stored(store, aredis, final):
    from shared.messages import CancelNotice

    pubsub = aredis.pubsub()
    await pubsub.subscribe(names.FINAL_CHANNEL, names.CANCEL_CHANNEL)
    await _job(store, total=1)
    await store.acquire_lease(_sub(), "w1", 30, 3)
    await store.charge_attempts([_sub().member], "w1")
    await store.store_result("j1", SubResult(index=0, output=_text("x"), worker="w1"))
    rec, _results = await store.get_with_results("j1")
    output = [{"text": "x"}]
    got = await store.finalize_record("j1", final, output, rec=rec, all_results=True)
    assert got == await store.get("j1")
    assert got.status == final and got.output == output and got.completed_at is not None
    assert await store.finalize_record("j1", final, output, rec=rec) is None  # once
    heard = await _heard(pubsub)
    expected = [(names.FINAL_CHANNEL.encode(), b"j1")]
    if final != JobStatus.SUCCEEDED:  # workers drop what they still run of it
        expected.append((names.CANCEL_CHANNEL.encode(),
                         CancelNotice(job_id="j1").encode().encode()))
    assert heard == expected
    # No webhook: no `final` entry; the result's is the only one.
    kinds = [f[b"kind"] for _id, f in await aredis.xrange(names.COMPLETIONS_STREAM)]
    assert kinds == [b"result"]
    assert 0 < await aredis.ttl(names.job_key("j1")) <= 3600
    assert 0 < await aredis.ttl(names.results_key("j1")) <= RAN_TTL_SECONDS


async def test_finalize_takes_a_job_with_a_deadline_out_of_the_deadlines(store, aredis):
    from shared.job import JobMeta

    await store.create(NewJob("j1", "text-generation", "tiny-gpt2", {"prompts": ["a"]}, 1,
                              JobMeta(deadline_seconds=60)))
    rec = await store.get("j1")
    assert await aredis.zscore(names.DEADLINES, "j1") is not None
    assert await store.finalize("j1", JobStatus.CANCELED, [None], rec=rec)
    assert await aredis.zscore(names.DEADLINES, "j1") is None


# A one-prompt job made final where its result is stored -------------------------------------

ONE_OUTPUT = {"text": "x", "finish_reason": "length", "tokens": 1, "worker": "w1"}


async def _leased_one(store: JobStore, meta=None) -> SubRequest:
    await store.create(NewJob("j1", "text-generation", "tiny-gpt2", {"prompts": ["a"]}, 1, meta))
    sub = _sub()
    await store.acquire_lease(sub, "w1", 30, 3)
    await store.charge_attempts([sub.member], "w1")
    return sub


async def test_a_one_prompt_jobs_last_result_makes_it_final_in_the_same_step(store, aredis):
    pubsub = aredis.pubsub()
    await pubsub.subscribe(names.FINAL_CHANNEL, names.CANCEL_CHANNEL)
    sub = await _leased_one(store)
    got = await store.store_last_result("j1", SubResult(index=0, output=_text("x"),
                                                        worker="w1"), ONE_OUTPUT, "tiny-gpt2")
    rec = await store.get("j1")
    assert isinstance(got, Finished)
    assert (got.task, got.created_at, got.started_at, got.completed_at) == (
        "text-generation", rec.created_at, rec.started_at, rec.completed_at)
    assert rec.status == JobStatus.SUCCEEDED and rec.output == [ONE_OUTPUT] and rec.done == 1
    assert await _heard(pubsub) == [(names.FINAL_CHANNEL.encode(), b"j1")]  # no cancel
    # Lease released, out of the backlog, nothing for a joiner; its attempt in the record.
    assert await aredis.zscore(names.LEASES, sub.member) is None
    assert await store.lease_owner("j1", sub.index) is None
    assert await aredis.zscore(names.backlog_key("tiny-gpt2"), sub.member) is None
    assert await aredis.xlen(names.COMPLETIONS_STREAM) == 0
    assert not await aredis.exists(names.results_key("j1"))
    assert await store.attempts("j1", 0) == 1
    assert 0 < await aredis.ttl(names.job_key("j1")) <= 3600
    # A second delivery's result is refused; the output stays.
    assert await store.store_last_result("j1", SubResult(index=0, output=_text("y")),
                                         {"text": "y"}, "tiny-gpt2") == -2
    assert (await store.get("j1")).output == [ONE_OUTPUT]


async def test_a_one_prompt_job_made_final_with_its_result_does_what_finalize_would(
        store, aredis):
    """Its deadline is dropped, its webhook deliveries kept with it, and its `completed`
    webhook announced on the stream for the joiners, as FINALIZE does."""
    from shared.job import JobMeta

    meta = JobMeta(deadline_seconds=60, webhook="https://hooks.example.com/x")
    await _leased_one(store, meta)
    await aredis.rpush(names.webhooks_key("j1"), "{}")  # a delivery recorded while it ran
    await store.store_last_result("j1", SubResult(index=0, output=_text("x"), worker="w1"),
                                  ONE_OUTPUT, "tiny-gpt2")
    assert await aredis.zscore(names.DEADLINES, "j1") is None
    assert 0 < await aredis.ttl(names.webhooks_key("j1")) <= 3600
    entries = await aredis.xrange(names.COMPLETIONS_STREAM)
    assert [(f[b"job"], f[b"kind"]) for _id, f in entries] == [(b"j1", b"final")]


@pytest.mark.parametrize("case", ["two prompts", "stored by an older API"])
async def test_a_last_result_is_only_a_result_for_any_other_job(store, aredis, case):
    if case == "two prompts":
        await _job(store, total=2)
    else:
        await _job(store, total=1)
        await aredis.hdel(names.job_key("j1"), "fin")
    await store.acquire_lease(_sub(), "w1", 30, 3)
    got = await store.store_last_result("j1", SubResult(index=0, output=_text("x"),
                                                        worker="w1"), ONE_OUTPUT, "tiny-gpt2")
    assert got == 1
    rec, results = await store.get_with_results("j1")
    assert rec.status == JobStatus.RUNNING and rec.output is None and rec.done == 1
    assert results[0].output == _text("x")
    kinds = [f[b"kind"] for _id, f in await aredis.xrange(names.COMPLETIONS_STREAM)]
    assert kinds == [b"result"]


async def test_a_last_result_cannot_end_a_job_that_is_final(store):
    await _leased_one(store)
    assert await store.finalize("j1", JobStatus.CANCELED, [None])
    assert await store.store_last_result("j1", SubResult(index=0, output=_text("x")),
                                         ONE_OUTPUT, "tiny-gpt2") == -2
    rec = await store.get("j1")
    assert rec.status == JobStatus.CANCELED and rec.output == [None]


async def test_the_dead_letter_list_keeps_the_newest_entries_and_never_a_prompt(store, aredis):
    await _job(store, total=5)
    prompt = "a caller's private words"
    subs = [SubRequest(job_id="j1", index=i, model="tiny-gpt2", owner="k1",
                       item=TextItem(prompt=prompt, max_new_tokens=2)) for i in range(5)]
    for sub in subs:
        await store.dead_letter(sub, dead_lettered(sub, 3, worker="janitor"), attempts=3, keep=3)

    raw = await aredis.lrange(names.DEAD_LETTER, 0, -1)
    letters = [DeadLetter.decode(r) for r in raw]
    assert [letter.index for letter in letters] == [4, 3, 2]  # newest first, the rest trimmed
    assert all(prompt.encode() not in r for r in raw)
    first = letters[0]
    assert (first.job_id, first.model, first.owner, first.code, first.attempts) == (
        "j1", "tiny-gpt2", "k1", "dead_lettered", 3)
    assert first.prompt_chars == len(prompt) and "3 attempts" in first.reason
    assert len(await store.results("j1")) == 5  # each one's failure is its result all the same
