"""Batch work below interactive work, end to end: one API and ONE CPU worker that runs one
sub-request at a time, two API keys. Key A's 300-line batch fills the model's queue (its limit
is 300, and A's share of it all of it); key B's interactive jobs are still accepted (the 503
"overloaded" counts the interactive backlog only), run before every batch line queued when
they were submitted, and the batch completes with no line lost."""

import json
import subprocess
import time
from datetime import datetime
from typing import IO

import httpx
import pytest
import redis

from services.api.auth import digest, key_id
from services.devstack.processes import start_api, start_workers, stop
from services.devstack.redis_server import free_port
from shared import names
from shared.queue_depth import batch_list

pytestmark = pytest.mark.e2e

KEY_A, KEY_B = "fm-test-key-batches", "fm-test-key-interactive"
A, B = {"Authorization": f"Bearer {KEY_A}"}, {"Authorization": f"Bearer {KEY_B}"}
LINES = 300
MODEL = "tiny-gpt2"
FINAL = {"succeeded", "failed", "canceled"}


def _until(what: str, check, seconds: float = 120.0):
    deadline = time.monotonic() + seconds
    while not (got := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return got


class Stack:
    def __init__(self, redis_url: str, model_dir, logs) -> None:
        self.env = {
            "FIBERMILL_REDIS_URL": redis_url,
            "FIBERMILL_MODEL_REGISTRY": str(model_dir / "registry.yaml"),
            "FIBERMILL_BLOB_DIR": str(logs / "blobs"),
            "FIBERMILL_API_KEYS": f"{KEY_A},{KEY_B}",
            "FIBERMILL_MAX_QUEUE_DEPTH": str(LINES),
            "FIBERMILL_BATCH_QUEUE_SHARE_PER_KEY": "1.0",
            "FIBERMILL_BATCH_MAX_IN_FLIGHT": str(LINES),
            # The review's setting: a burst of 5 a minute. Batch lines take no token.
            "FIBERMILL_RATE_LIMIT_PER_MINUTE": "5",
            "FIBERMILL_RATE_LIMIT_BURST": "5",
            "FIBERMILL_CPU_WORKERS": "1",
            "FIBERMILL_WORKER_CONCURRENCY": "1",
            "FIBERMILL_WORKER_MODELS": MODEL,
            "FIBERMILL_WORKER_METRICS_PORT": str(free_port()),
            "FIBERMILL_LOG_LEVEL": "WARNING",
            "OMP_NUM_THREADS": "1",
        }
        self.redis = redis.Redis.from_url(redis_url)
        self.logs = logs
        self.files: list[IO[str]] = []
        self.procs: list[subprocess.Popen] = []
        self.base = f"http://127.0.0.1:{free_port()}"
        self.http = httpx.Client(base_url=self.base, timeout=30)

    def _log(self, name: str):
        f = open(self.logs / f"{name}.log", "w")  # noqa: SIM115 - closed in close()
        self.files.append(f)
        return {"stdout": f, "stderr": f}

    def start_api(self) -> None:
        port = int(self.base.rsplit(":", 1)[1])
        self.procs.append(start_api(port, self.env, **self._log("api")))

        def up() -> bool:
            try:
                return self.http.get("/healthz").status_code == 200
            except httpx.TransportError:
                assert self.procs[0].poll() is None, self.tail()
                return False

        _until("the API", up, 60)

    def start_workers(self) -> None:
        self.procs.append(start_workers(self.env, **self._log("workers")))

    def tail(self) -> str:
        return "\n".join(p.read_text()[-4000:] for p in sorted(self.logs.glob("*.log")))

    def close(self) -> None:
        self.http.close()
        stop(self.procs)
        for f in self.files:
            f.close()


@pytest.fixture
def stack(redis_server, model_dir, tmp_path_factory):
    redis.Redis.from_url(redis_server.url).flushdb()
    s = Stack(redis_server.url, model_dir, tmp_path_factory.mktemp("batch-priority"))
    try:
        s.start_api()
        yield s
    finally:
        s.close()


def _batch(http: httpx.Client) -> str:
    lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": MODEL, "prompt": f"line {i}", "max_tokens": 2}}
             for i in range(LINES)]
    content = "".join(json.dumps(x) + "\n" for x in lines).encode()
    f = http.post("/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"},
                  headers=A)
    assert f.status_code == 200, f.text
    b = http.post("/v1/batches", json={"input_file_id": f.json()["id"], "completion_window": "24h",
                                       "endpoint": "/v1/completions"}, headers=A)
    assert b.status_code == 200, b.text
    return b.json()["id"]


def _interactive(http: httpx.Client) -> str:
    r = http.post("/v1/jobs", json={"model": MODEL, "input": {"prompts": ["now"],
                                                              "max_new_tokens": 2}}, headers=B)
    assert r.status_code == 202, r.text  # never 503 for the batch's backlog
    return r.json()["id"]


def _job(http: httpx.Client, job_id: str) -> dict:
    return http.get(f"/v1/jobs/{job_id}", headers=B).json()


def _batch_starts(r: redis.Redis) -> list[float]:
    """When each of key A's jobs (the batch's lines) started, those that did."""
    owner = key_id(digest(KEY_A)).encode()
    starts = []
    for key in r.scan_iter(match=f"{names.PREFIX}:job:*", count=1000):
        if key.count(b":") != 2:
            continue
        meta, started = r.hmget(key, ["meta", "started_at"])
        if meta is not None and json.loads(meta).get("owner") == owner.decode() and started:
            starts.append(float(started))
    return starts


def test_interactive_jobs_pass_a_full_batch_and_are_never_refused_for_it(stack):
    r, http = stack.redis, stack.http
    batch_id = _batch(http)
    # Every line queued before any worker runs: the queue holds its limit of batch work.
    _until("every line queued", lambda: r.llen(batch_list(MODEL)) == LINES)
    first = _interactive(http)  # counted with the batch, 300 + 1 would pass the limit of 300
    stack.start_workers()
    done = _until("the first interactive job", lambda: (
        j := _job(http, first))["status"] in FINAL and j)
    assert done["status"] == "succeeded", done

    # Submitted while the worker runs the batch: it starts before the lines queued then.
    _until("the batch under way", lambda: LINES - r.llen(batch_list(MODEL)) >= 20)
    second = _interactive(http)
    queued_then = r.llen(batch_list(MODEL))  # each queued while job 2 was
    done2 = _until("the second interactive job", lambda: (
        j := _job(http, second))["status"] in FINAL and j)
    assert done2["status"] == "succeeded", done2

    _until("the batch", lambda: http.get(f"/v1/batches/{batch_id}", headers=A).json()[
        "status"] == "completed", 300)
    batch = http.get(f"/v1/batches/{batch_id}", headers=A).json()
    assert batch["request_counts"] == {"total": LINES, "completed": LINES, "failed": 0}
    starts = _batch_starts(r)
    assert len(starts) == LINES
    first_started = _job(http, first)["started_at"]
    assert all(s > _ts(first_started) for s in starts), "a batch line ran before job 1"
    after = sum(s > _ts(done2["started_at"]) for s in starts)
    # The worker holds one message at a time (one thread, prefetch one): once the line it ran
    # when job 2 came is done, it takes job 2 before any line still queued.
    assert after >= queued_then, (after, queued_then)
    print(f"\nbatch lines queued when job 2 was submitted: {queued_then}; started after job 2: "
          f"{after}; job 2 queued {done2['metrics']['queue_seconds']:.3f}s, "
          f"job 1 queued {done['metrics']['queue_seconds']:.3f}s")


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()
