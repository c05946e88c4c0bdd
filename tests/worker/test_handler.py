"""A worker runtime in this process, on real Redis and real tiny models: leases, write-once
results, model errors, time limits and dead-lettering."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from services.api.assembly import assemble
from services.worker.runtime import WorkerRuntime
from shared import names
from shared.celery_config import make_celery
from shared.job_metrics import JOBS_FINISHED
from shared.jobstore import JobStore, NewJob
from shared.messages import (
    DeadLetter,
    GeneratedText,
    OutputEvent,
    SubRequest,
    SubResult,
    TextItem,
)
from shared.registry import load_registry
from shared.settings import Settings


@pytest.fixture(scope="module")
def runtime(redis_server, model_dir):
    settings = Settings(redis_url=redis_server.url, model_registry=model_dir / "registry.yaml",
                        worker_models="tiny-gpt2,broken-gpt2", max_attempts=2,
                        subrequest_time_limit_seconds=1,
                        heartbeat_seconds=0.2, lease_seconds=2)
    celery = make_celery(settings)
    rt = WorkerRuntime(settings, load_registry(settings.model_registry), celery)
    rt.start()
    yield rt
    rt.stop()
    celery.close()


def _sub(index=0, model="tiny-gpt2", **item) -> SubRequest:
    item = {"prompt": "hello", "max_new_tokens": 3, **item}
    return SubRequest(job_id="j1", index=index, model=model, item=TextItem(**item))


@pytest.fixture
def job(runtime, redis_url):
    def create(total=1, watched=False):
        async def go():
            await runtime.store.create(NewJob("j1", "text-generation", "tiny-gpt2",
                                              {"prompts": ["hello"] * total}, total,
                                              watched=watched))
        runtime.call(go())
    return create


def _results(rt: WorkerRuntime):
    return rt.call(rt.store.results("j1"))


def _record(rt: WorkerRuntime):
    return rt.call(rt.store.get("j1"))


def test_runs_once_and_skips_a_duplicate(runtime, job):
    job(total=2)
    assert runtime.handle(_sub()) == "succeeded"
    first = _results(runtime)[0]
    assert first.output.tokens == 3 and first.worker == runtime.id
    assert first.output.prompt_tokens == 3  # "hello", to this tiny tokenizer
    assert runtime.handle(_sub()) == "done"
    assert _results(runtime)[0] == first
    assert len(runtime.flights) == 0
    # Charged once, as it started on the device; the duplicate never started.
    assert runtime.call(runtime.store.attempts("j1", 0)) == 1
    assert _record(runtime).status == "running"  # the other prompt is the joiner's to wait for


def test_a_one_prompt_text_job_is_made_final_where_its_result_is_stored(runtime, job):
    """No sub-result and no completion entry: the record holds the output, as the API would
    have assembled it from the sub-result, and a duplicate delivery finds the job final."""
    job()
    finished = JOBS_FINISHED.labels("text-generation", "tiny-gpt2", "succeeded")
    before = finished._value.get()
    stream = runtime.call(runtime.store.redis.xlen(names.COMPLETIONS_STREAM))
    assert runtime.handle(_sub()) == "succeeded"
    rec = _record(runtime)
    assert rec.status == "succeeded" and rec.done == 1 and rec.completed_at >= rec.started_at
    assert rec.output[0]["tokens"] == 3 and rec.output[0]["worker"] == runtime.id
    assert _results(runtime) == {}
    assert runtime.call(runtime.store.redis.xlen(names.COMPLETIONS_STREAM)) == stream
    assert finished._value.get() == before + 1
    # What the API would have written from the same sub-result.
    text = GeneratedText(**{k: rec.output[0][k] for k in GeneratedText.model_fields
                            if k in rec.output[0]})
    api = assemble(rec, {0: SubResult(index=0, output=text, worker=runtime.id)}, "")
    assert [o.model_dump(mode="json") for o in api] == rec.output
    assert runtime.handle(_sub()) == "final"
    assert _record(runtime).output == rec.output
    assert runtime.call(runtime.store.attempts("j1", 0)) == 1


def test_streamed_text_is_published_before_its_result_is_stored(runtime, job, redis_url):
    job(watched=True)  # as an OpenAI stream stores it
    pubsub = redis.Redis.from_url(redis_url).pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(names.events_channel("j1"))
    assert pubsub.get_message(timeout=1) is None  # the subscription, confirmed
    assert runtime.handle(_sub(max_new_tokens=30, stream=True)) == "succeeded"
    outputs = []
    while (msg := pubsub.get_message(timeout=0.01)) is not None:
        if (event := msg["data"]).startswith(b'{"event":"output"'):
            outputs.append(OutputEvent.decode(event).data)
    pubsub.close()
    stored = _record(runtime).output[0]
    assert "".join(d.text for d in outputs) == stored["text"]
    assert (outputs[-1].finish_reason, outputs[-1].prompt_tokens) == ("length", 3)
    assert len(outputs) > 2  # at every read


def test_a_job_nobody_watches_has_no_events_made(runtime, job, redis_url):
    """Not its start, not its text (even an item that streams): no live stream listens."""
    job()
    pubsub = redis.Redis.from_url(redis_url).pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(names.events_channel("j1"))
    assert pubsub.get_message(timeout=1) is None  # the subscription, confirmed
    assert runtime.handle(_sub(max_new_tokens=30, stream=True)) == "succeeded"
    assert pubsub.get_message(timeout=0.3) is None
    pubsub.close()
    assert _record(runtime).output[0]["tokens"] == 30


def _charges(runtime, monkeypatch) -> list[list[str]]:
    """The members of each charge script the worker runs from now on."""
    charged: list[list[str]] = []
    real = runtime.store.charge_attempts

    async def charge_attempts(members: list[str], worker: str) -> int:
        charged.append(list(members))
        return await real(members, worker)

    monkeypatch.setattr(runtime.store, "charge_attempts", charge_attempts)
    return charged


def test_an_engine_with_room_charges_the_attempt_with_the_lease(runtime, job, monkeypatch):
    """Nothing between the lease and the device: the lease's own write charges the attempt,
    and no charge script runs."""
    job()
    charged = _charges(runtime, monkeypatch)
    assert runtime.handle(_sub()) == "succeeded"
    assert runtime.call(runtime.store.attempts("j1", 0)) == 1
    assert charged == []


def test_a_full_engine_charges_the_attempt_when_it_starts(runtime, job, monkeypatch):
    job()
    decoder = runtime.engines["tiny-gpt2"].scheduling

    async def announce(n: int) -> None:  # arrivals ahead of it, that take every slot
        decoder.expected += n

    runtime.call(announce(decoder.slots))
    try:
        charged = _charges(runtime, monkeypatch)
        assert runtime.handle(_sub()) == "succeeded"
    finally:
        runtime.call(announce(-decoder.slots))
    assert runtime.call(runtime.store.attempts("j1", 0)) == 1
    assert len(charged) == 1 and len(charged[0]) == 1


def test_concurrent_deliveries_run_the_model_once(runtime, job):
    job()
    with ThreadPoolExecutor(4) as pool:  # as Celery's thread pool would deliver them
        outcomes = list(pool.map(lambda _: runtime.handle(_sub()), range(4)))
    assert outcomes.count("succeeded") == 1
    assert set(outcomes) <= {"succeeded", "busy", "final"}  # "final": it ended the job


def test_model_error_is_stored_and_worker_goes_on(runtime, job):
    job(total=2)
    assert runtime.handle(_sub(0, "broken-gpt2")) == "failed"
    err = _results(runtime)[0].error
    assert err.code == "model_error" and err.message.startswith("IndexError")
    assert runtime.handle(_sub(1)) == "succeeded"


def test_a_prompt_past_the_context_fails_with_its_own_code_not_cut(runtime, job):
    # The API refuses it first; a job that reaches a worker anyway fails clearly.
    job()
    assert runtime.handle(_sub(prompt="word " * 1100, max_new_tokens=3)) == "failed"
    err = _results(runtime)[0].error
    assert err.code == "context_length_exceeded"
    assert "tiny-gpt2's context of 1024 tokens" in err.message


def test_time_limit_stops_a_long_run(runtime, job):
    job()
    sub = _sub(max_new_tokens=1000)  # within the context: a longer one is refused
    with ThreadPoolExecutor(1) as pool:
        outcome = pool.submit(runtime.handle, sub)
        deadline = time.monotonic() + 30
        while sub.member not in runtime.flights:  # leased: its clock runs
            assert time.monotonic() < deadline and not outcome.done(), "it never started"
            time.sleep(0.001)
        # Past its limit at the heartbeat's next check, whatever this machine's speed: the
        # tiny model writes its 1,000 tokens in well under the 1 s limit.
        next(iter(runtime.flights)).deadline = time.time() - 1
        runtime.call(runtime.heartbeat.enforce_time_limits())
        assert outcome.result(timeout=10) == "time_limit"
    result = _results(runtime)[0]
    assert result.error.code == "time_limit_exceeded" and "1s limit" in result.error.message


def test_exhausted_attempts_are_dead_lettered(runtime, job, sredis):
    job()
    store: JobStore = runtime.store
    for _ in range(2):  # two earlier attempts that each lost their worker while running it
        runtime.call(store.acquire_lease(_sub(), "dead", lease_seconds=-1, max_attempts=2))
        runtime.call(store.charge_attempts([_sub().member], "dead"))
        runtime.call(store.claim_expired_leases())
    assert runtime.handle(_sub()) == "exhausted"
    assert _results(runtime)[0].error.code == "dead_lettered"
    (raw,) = sredis.lrange(names.DEAD_LETTER, 0, -1)
    letter = DeadLetter.decode(raw)
    assert (letter.job_id, letter.index, letter.code, letter.attempts, letter.prompt_chars) == (
        "j1", 0, "dead_lettered", 2, len("hello"))
    assert b"hello" not in raw


def test_cached_prompt_pages_are_shared_within_the_api_key_unless_global(runtime, monkeypatch):
    handler = runtime.handler
    owned = _sub().model_copy(update={"owner": "key-1"})
    assert handler._cache_scope(owned) == "key-1"
    assert handler._cache_scope(_sub()) == ""  # no keys: one scope
    monkeypatch.setattr(handler.settings, "prefix_cache_scope", "global")
    assert handler._cache_scope(owned) == ""
