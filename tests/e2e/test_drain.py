"""Graceful drain on real processes: a SIGTERMed worker (or its launcher, as Kubernetes would
SIGTERM the pod's PID 1) finishes what it holds and exits; past FIBERMILL_DRAIN_SECONDS it
hands the rest back to another worker; a SIGTERMed API turns unready at once, finishes its
requests in flight and exits 0."""

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import redis

from services.devstack.processes import start_api, start_workers, stop
from services.devstack.redis_server import free_port
from services.worker.drain import DRAIN_STOP_GRACE_SECONDS
from shared import names
from shared.jobstore import attempts_in, lease_owners_in
from shared.messages import WorkerHeartbeat

pytestmark = pytest.mark.e2e

FINAL = {"succeeded", "failed", "canceled"}
LONG_DRAIN = 20.0  # far longer than any job here: whatever a worker holds, it finishes
# 8 prompts x 4 images = 32 sub-requests: exactly what one digits worker holds (2 x max_batch),
# two batches of 16 at 30 steps, a few seconds on this CPU.
HELD_JOB = {"task": "image-generation", "model": "digits",
            "input": {"prompts": list("01234567"), "num_images_per_prompt": 4, "steps": 30,
                      "seed": 5}}


@pytest.fixture(scope="module")
def env(redis_server, model_dir):
    redis.Redis.from_url(redis_server.url).flushdb()
    return {
        "FIBERMILL_REDIS_URL": redis_server.url,
        "FIBERMILL_MODEL_REGISTRY": str(model_dir / "registry.yaml"),
        "FIBERMILL_CPU_WORKERS": "1",
        "FIBERMILL_WORKER_MODELS": "digits",  # loads in seconds
        # Leases shorter than a drain: one not renewed while draining would be re-sent by the
        # janitor, and its attempts would show it.
        "FIBERMILL_LEASE_SECONDS": "1.5",
        "FIBERMILL_HEARTBEAT_SECONDS": "0.3",
        "FIBERMILL_JANITOR_INTERVAL_SECONDS": "0.5",
        "FIBERMILL_WORKER_HEARTBEAT_TTL_SECONDS": "3",
        "FIBERMILL_WORKER_METRICS_PORT": "0",
        "FIBERMILL_RATE_LIMIT_BURST": "1000",
        "FIBERMILL_LOG_LEVEL": "WARNING",
        # One thread: the model is tiny, and a spinning thread pool on a busy 2-core host
        # costs far more than it gains.
        "OMP_NUM_THREADS": "1",
    }


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("drain-logs")


class Api:
    def __init__(self, env: dict, logs: Path, name: str, **extra_env) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(logs / f"{name}.log", "w")  # noqa: SIM115 - closed in close()
        self.proc = start_api(self.port, {**env, **extra_env}, stdout=self.log, stderr=self.log)
        self.http = httpx.Client(base_url=self.url, timeout=60)
        self.redis = redis.Redis.from_url(env["FIBERMILL_REDIS_URL"])

    def ready(self) -> None:
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, "the API exited"
            with contextlib.suppress(httpx.HTTPError):
                if self.http.get("/readyz").status_code in (200, 503):
                    return
            assert time.monotonic() < deadline, "the API did not start"
            time.sleep(0.1)

    def submit(self, body: dict) -> str:
        r = self.http.post("/v1/jobs", json=body)
        assert r.status_code == 202, r.text
        return r.json()["id"]

    def wait(self, job_id: str, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.http.get(f"/v1/jobs/{job_id}").json()
            if job["status"] in FINAL:
                return job
            time.sleep(0.05)
        raise AssertionError(f"job {job_id} not final after {timeout}s: {job}")

    def close(self) -> None:
        self.http.close()
        stop([self.proc])
        self.log.close()


@pytest.fixture(scope="module")
def api(env, logs):
    a = Api(env, logs, "api")
    a.ready()
    yield a
    a.close()


@contextlib.contextmanager
def launcher(env: dict, logs: Path, name: str, drain: float):
    log = open(logs / f"{name}.log", "w")  # noqa: SIM115 - closed below
    proc = start_workers({**env, "FIBERMILL_DRAIN_SECONDS": str(drain)}, stdout=log, stderr=log)
    try:
        yield proc
    finally:
        stop([proc], timeout=60)
        log.close()


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    """Running, and not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def worker_of(r: redis.Redis, launcher_proc: subprocess.Popen, timeout: float = 120,
              other_than: str | None = None) -> WorkerHeartbeat:
    """The live worker process the launcher started (announced in Redis)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert launcher_proc.poll() is None, "the launcher exited"
        for key in r.scan_iter(match=f"{names.WORKER_PREFIX}*"):
            raw = r.get(key)
            if raw is None:
                continue
            info = WorkerHeartbeat.decode(raw)
            if _ppid(info.pid) == launcher_proc.pid and info.id != other_than and _alive(info.pid):
                return info
        time.sleep(0.1)
    raise AssertionError("the launcher's worker did not come up")


def wait_all_held(r: redis.Redis, job_id: str, total: int, timeout: float = 60) -> None:
    """Until every sub-request of the job is leased (running) or done."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leased = len(lease_owners_in(r.hgetall(names.job_key(job_id))))
        if leased + r.hlen(names.results_key(job_id)) >= total:
            return
        time.sleep(0.01)
    raise AssertionError(f"job {job_id}: not all {total} sub-requests were taken")


def wait_exit(pid: int, timeout: float) -> float:
    t0 = time.monotonic()
    while _alive(pid):
        assert time.monotonic() - t0 < timeout, f"pid {pid} still running after {timeout}s"
        time.sleep(0.05)
    return time.monotonic() - t0


def completed_once(r: redis.Redis, job_id: str, total: int) -> None:
    # Each index's result written once: STORE_RESULT counts `done` only for a first write (the
    # stream's own entries are trimmed once the joiners acknowledged them).
    assert r.hlen(names.results_key(job_id)) == total
    assert int(r.hget(names.job_key(job_id), "done")) == total


def attempts(r: redis.Redis, job_id: str) -> list[int]:
    charged = attempts_in(r.hgetall(names.job_key(job_id)))
    return [charged[i] for i in range(len(charged))]


def nothing_left_in_the_broker(r: redis.Redis) -> None:
    # No message is left queued (a drained worker hands back what it took and did not run, and
    # its hand-backs were taken again) and nothing written for the broker's own bookkeeping.
    assert not [k for k in r.scan_iter(match=f"{names.queue_for('digits')}*") if r.llen(k)]
    assert not r.exists("unacked")


def results(r: redis.Redis, job_id: str) -> dict[int, dict]:
    return {int(k): json.loads(v) for k, v in r.hgetall(names.results_key(job_id)).items()}


@pytest.mark.parametrize("target", ["launcher", "worker"])
def test_sigterm_mid_job_finishes_what_the_worker_holds(api, env, logs, target):
    total = 32
    with launcher(env, logs, f"workers-{target}", LONG_DRAIN) as proc:
        worker = worker_of(api.redis, proc)
        job_id = api.submit(HELD_JOB)
        wait_all_held(api.redis, job_id, total)
        assert api.redis.hlen(names.results_key(job_id)) < total  # it lands mid-run
        os.kill(proc.pid if target == "launcher" else worker.pid, signal.SIGTERM)
        took = wait_exit(worker.pid, LONG_DRAIN)  # within its grace period
        if target == "launcher":
            assert proc.wait(LONG_DRAIN - took) == 0
        job = api.wait(job_id)
        assert job["status"] == "succeeded", (job, (logs / f"workers-{target}.log").read_text())
        assert {o["worker"] for o in job["output"]} == {worker.id}  # all done by the drain
        completed_once(api.redis, job_id, total)
        assert attempts(api.redis, job_id) == [1] * total  # none ran twice
        nothing_left_in_the_broker(api.redis)
        assert api.redis.get(names.worker_key(worker.id)) is None  # withdrawn at exit


def test_past_the_drain_deadline_held_work_goes_to_another_worker(api, env, logs):
    drain = 1.0
    # Four images of 400 steps: about five seconds here, far past the drain deadline.
    body = {"task": "image-generation", "model": "digits",
            "input": {"prompts": ["3", "8"], "num_images_per_prompt": 2, "steps": 400,
                      "seed": 9}}
    with launcher(env, logs, "workers-handback", drain) as proc:
        victim = worker_of(api.redis, proc)
        job_id = api.submit(body)
        wait_all_held(api.redis, job_id, 4)
        t_term = time.time()
        os.kill(victim.pid, signal.SIGTERM)
        wait_exit(victim.pid, drain + DRAIN_STOP_GRACE_SECONDS + 5)
        # The launcher starts a fresh worker process, which takes what was handed back.
        successor = worker_of(api.redis, proc, other_than=victim.id)
        job = api.wait(job_id)
        assert job["status"] == "succeeded", (job, (logs / "workers-handback.log").read_text())
        assert {o["worker"] for o in job["output"]} == {successor.id}, (victim.id, job)
        completed_once(api.redis, job_id, 4)
        # Handed back, not lost: the attempt the drain cut short was given back, and the rerun
        # started only after the deadline, so the two never ran in parallel.
        assert attempts(api.redis, job_id) == [1, 1, 1, 1]
        assert all(r["started_at"] > t_term + drain for r in results(api.redis, job_id).values())
        nothing_left_in_the_broker(api.redis)


def test_sigterm_api_turns_unready_finishes_requests_and_exits_0(api, env, logs):
    # Long enough to outlast the drain delay (1.5 s) on any machine; the waited job is ended
    # by a cancel once the socket has closed, so its end does not depend on the machine's speed.
    body = {"task": "image-generation", "model": "digits",
            "input": {"prompts": ["1", "2"], "steps": 400, "seed": 2}}
    with launcher(env, logs, "workers-api", LONG_DRAIN) as proc:
        worker_of(api.redis, proc)
        drained = Api(env, logs, "api-drained", FIBERMILL_API_DRAIN_SECONDS="1.5")
        try:
            drained.ready()
            assert drained.http.get("/readyz").status_code == 200
            answer: dict = {}
            first = api.submit(body)  # a job to follow live
            events: list[str] = []

            def follow() -> None:
                try:  # a client per thread: they share no connection pool
                    with httpx.Client(base_url=drained.url, timeout=60) as client, \
                            client.stream("GET", f"/v1/jobs/{first}/events") as r:
                        for line in r.iter_lines():
                            events.append(line)
                except httpx.HTTPError as exc:  # cut short instead of ended
                    answer["events_error"] = repr(exc)
                answer["events_ended"] = time.monotonic()

            def wait_request() -> None:
                with httpx.Client(base_url=drained.url, timeout=60) as client:
                    r = client.post("/v1/jobs", json=body, headers={"Prefer": "wait=60"})
                answer["status"], answer["job"] = r.status_code, r.json()

            threads = [threading.Thread(target=follow), threading.Thread(target=wait_request)]
            for t in threads:
                t.start()
            while not events:
                time.sleep(0.02)
            time.sleep(0.3)  # the wait request is in
            t_term = time.monotonic()
            drained.proc.send_signal(signal.SIGTERM)
            r = drained.http.get("/readyz")  # at once: 503
            assert r.status_code == 503 and r.json()["status"] == "draining"
            assert drained.http.get("/healthz").status_code == 200  # still serving
            # After the drain delay the socket closes, while the wait request goes on.
            while True:
                try:
                    httpx.get(f"{drained.url}/healthz", timeout=1)
                except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
                    # Refused, or reset by a socket closing under the probe: closed either way.
                    break
                assert time.monotonic() - t_term < 10, "the socket never closed"
                time.sleep(0.1)
            assert time.monotonic() - t_term >= 1.4
            assert "job" not in answer  # still waiting for its job
            threads[0].join(10)
            assert "events_ended" in answer, answer  # the stream ended: the process can go
            assert "events_error" not in answer, answer  # ...cleanly, with its last chunk
            # The request in flight is answered once its job is final (here: canceled now,
            # through the other replica), after the socket closed.
            waited = [j["id"] for j in api.http.get("/v1/jobs").json()["jobs"]
                      if j["id"] != first and j["status"] not in FINAL]
            assert len(waited) == 1, waited
            assert api.http.post(f"/v1/jobs/{waited[0]}/cancel").status_code == 200
            threads[1].join(30)
            assert answer["status"] == 200 and answer["job"]["status"] == "canceled", answer
            assert drained.proc.wait(15) == 0
            assert api.wait(first)["status"] == "succeeded"
        finally:
            drained.close()
