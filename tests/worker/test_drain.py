"""The worker's drain (services/worker/drain.py) in this process, on real Redis and tiny-gpt2:
what outlives the drain deadline is stopped and handed back to its queue with its attempt
given back; what ends in time is stored as usual."""

import base64
import json
import threading
import time

import pytest

from services.worker import drain
from services.worker import exits as exits_module
from services.worker.exits import ExitReason
from services.worker.flights import InFlight
from services.worker.runtime import WorkerRuntime
from shared import names
from shared.celery_config import make_celery
from shared.jobstore import NewJob
from shared.messages import SubRequest, TextItem
from shared.registry import load_registry
from shared.settings import Settings
from tests.conftest import queued

JOB = "jd"


@pytest.fixture
def runtime(redis_url, model_dir):
    settings = Settings(redis_url=redis_url, model_registry=model_dir / "registry.yaml",
                        worker_models="tiny-gpt2", drain_seconds=0.5, heartbeat_seconds=0.2,
                        lease_seconds=2, max_attempts=2)
    celery = make_celery(settings)
    rt = WorkerRuntime(settings, load_registry(settings.model_registry), celery)
    rt.start()
    rt.call(rt.store.create(NewJob(JOB, "text-generation", "tiny-gpt2", {"prompts": ["a", "b"]},
                                   2)))
    yield rt
    rt.stop()
    celery.close()


def _sub(index=0, tokens=3) -> SubRequest:
    return SubRequest(job_id=JOB, index=index, model="tiny-gpt2",
                      item=TextItem(prompt="hello", max_new_tokens=tokens))


def _in_background(rt: WorkerRuntime, sub: SubRequest) -> dict:
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("outcome", rt.handle(sub)))
    t.start()
    deadline = time.monotonic() + 30
    while sub.member not in rt.flights:
        assert time.monotonic() < deadline, "the sub-request never started"
        time.sleep(0.01)
    out["thread"] = t
    return out


def _leases(rt: WorkerRuntime):
    r = rt.redis
    return rt.call(r.zrange(names.LEASES, 0, -1)), rt.call(rt.store.lease_owners(JOB))


def test_past_the_deadline_a_sub_request_goes_back_to_its_queue(runtime, redis_url):
    # The model's 1,021 positions left after "hello" (a longer budget is refused): a fast
    # machine decodes them in under the fixture's 0.5 s, but not in 50 ms (a step costs more
    # than 50 us on any).
    runtime.settings.drain_seconds = 0.05
    running = _in_background(runtime, _sub(tokens=1021))
    t0 = time.monotonic()
    runtime.begin_drain()
    running["thread"].join(10)
    assert running["outcome"] == "handed_back"
    assert 0.05 <= time.monotonic() - t0 < 5
    assert len(runtime.flights) == 0
    assert _leases(runtime) == ([], {})  # released
    assert runtime.call(runtime.store.attempts(JOB, 0)) == 0  # a drain is not a lost worker
    assert runtime.call(runtime.store.results(JOB)) == {}
    assert queued(redis_url, "tiny-gpt2") == 1
    raw = runtime.call(runtime.redis.lrange(names.queue_for("tiny-gpt2") + ":5", 0, -1))
    message = json.loads(raw[0])
    body = json.loads(base64.b64decode(message["body"]))
    assert message["headers"]["task"] == names.RUN_SUBREQUEST_TASK
    assert SubRequest.model_validate(body[0][0]).member == f"{JOB}:0"  # at its job's priority


def test_what_ends_within_the_drain_is_stored(runtime, redis_url):
    runtime.settings.drain_seconds = 30
    runtime.begin_drain()
    assert runtime.handle(_sub(tokens=3)) == "succeeded"
    assert 0 in runtime.call(runtime.store.results(JOB))
    assert queued(redis_url, "tiny-gpt2") == 0


def test_taken_after_the_deadline_goes_straight_back(runtime, redis_url):
    runtime.drainer.expired = True
    assert runtime.handle(_sub(index=1, tokens=100_000)) == "handed_back"
    assert queued(redis_url, "tiny-gpt2") == 1
    assert runtime.call(runtime.store.attempts(JOB, 1)) == 0


def test_a_lease_the_janitor_took_is_not_sent_again(runtime, redis_url):
    sub = _sub()
    runtime.call(runtime.store.acquire_lease(sub, "someone-else", 10, 3))
    runtime.call(runtime.store.charge_attempts([sub.member], "someone-else"))
    flight = InFlight(sub, deadline=time.time() + 60)
    flight.charged = True
    assert runtime.call(runtime.drainer.hand_back(flight)) == "lost_lease"
    assert queued(redis_url, "tiny-gpt2") == 0
    assert runtime.call(runtime.store.attempts(JOB, 0)) == 1  # not ours to give back


def test_a_sub_request_that_ignores_its_stop_is_left_to_the_janitor(runtime, monkeypatch):
    monkeypatch.setattr(drain, "DRAIN_STOP_GRACE_SECONDS", 0.2)
    exits = []
    monkeypatch.setattr(exits_module.os, "_exit", exits.append)
    sub = _sub()
    assert runtime.call(runtime.store.acquire_lease(sub, runtime.id, 10, 3)).outcome == "acquired"
    runtime.flights.add(InFlight(sub, time.time() + 60))  # nothing will stop it
    runtime.call(runtime.drainer.watch(time.monotonic()))
    assert exits == [ExitReason.STOP_IGNORED_IN_DRAIN]
    assert len(runtime.flights) == 0
    # The lease is expired (the janitor re-sends it at once), renamed (no renewal revives it),
    # and its attempt given back.
    assert runtime.call(runtime.redis.zscore(names.LEASES, sub.member)) == 0
    owner = runtime.call(runtime.store.lease_owner(JOB, 0))
    assert owner == drain.handback_owner(runtime.id)
    assert runtime.call(runtime.store.renew_leases([sub.member], runtime.id, 10)) == 0
    assert runtime.call(runtime.store.attempts(JOB, 0)) == 0
    assert runtime.call(runtime.store.claim_expired_leases()) == [(JOB, 0)]
