"""What the queue path costs per job: Redis commands, CPU per process, jobs/s.

    .venv/bin/python -m benchmarks.queue_cost -n 300 --clients 4

Starts a local stack (benchmarks/stack.py: Redis, API, one CPU worker serving
tiny-gpt2), sends `n` one-prompt jobs (4 new tokens) from a few concurrent asyncio clients with
`Prefer: wait=60`, and reports per job:

- Redis commands: the `INFO commandstats` delta over the run divided by the jobs, by command.
  Commands run inside Lua scripts are counted there too (as Redis counts them); the `top-level`
  column (from a short MONITOR sample) counts only what clients sent, i.e. the round trips'
  commands. The background loops (joiner, janitor, webhook sender, heartbeat, kombu) cost
  commands per second, not per job: measured idle, they are shown as their own line.
- CPU ms per process (/proc/<pid>/stat utime + stime): the API, the worker processes (the
  launcher's children), redis-server, and this client. The worker's figure includes the model.
  With py-spy installed (a dev tool), the worker's threads are named (`py-spy dump`) and the
  model's own threads (the device thread, the CPU operators' pool; one torch thread, as the
  stack's worker gets OMP_NUM_THREADS=1) are counted apart from /proc/<pid>/task/<tid>/stat:
  `queue path` is the stack's CPU less theirs. For comparison, the same engine is also run in
  this process, with as many closed-loop submitters as clients and with one at a time.
- jobs/s over the run.

`measure(Target(...), QueueLoad(...))` is the part other benchmarks can call with a stack of
their own. `--celery-noop` adds a bare Celery task for reference (celery_noop.py).
"""

import argparse
import asyncio
import os
import statistics
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis

from benchmarks.procstat import (
    cpu_seconds,
    is_model_thread,
    python_thread_names,
    thread_cpu_seconds,
    thread_group,
)
from benchmarks.redis_stats import Monitor, commandstats, connections_received, delta
from benchmarks.stack import bench_stack

FINAL = {"succeeded", "failed", "canceled"}
MODEL = "tiny-gpt2"


def text_body(tokens: int = 4) -> dict:
    return {"task": "text-generation", "model": MODEL,
            "input": {"prompts": ["Hello there"], "max_new_tokens": tokens}}


@dataclass(frozen=True)
class Target:
    """A running stack as `measure` watches it."""

    base_url: str
    redis_port: int
    pids: dict[str, list[int]]  # role (api, worker, redis...) -> its processes
    metrics_url: str | None = None


@dataclass(frozen=True)
class QueueLoad:
    """What `measure` sends, and how long it watches the stack idle."""

    n: int = 300  # jobs a round
    clients: int = 4
    repeat: int = 3  # rounds: commands are counted over all, CPU and jobs/s are the median's
    warmup: int = 20
    idle_seconds: float = 3.0
    monitor_jobs: int = 40  # more jobs under MONITOR (0 to skip)
    body: dict = field(default_factory=text_body)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "QueueLoad":
        return cls(n=args.n, clients=args.clients, repeat=args.repeat,
                   monitor_jobs=args.monitor_jobs)


@dataclass
class _Round:
    seconds: float
    threads: dict[str, float]  # worker CPU ms per job, by thread group
    model: float  # of which the model's threads
    cpu: dict[str, float]  # CPU ms per job, by role


# Load -----------------------------------------------------------------------------------------


async def _client(http: httpx.AsyncClient, body: dict, jobs: asyncio.Queue, polls: list[int],
                  failed: list[dict]) -> None:
    while True:
        try:
            jobs.get_nowait()
        except asyncio.QueueEmpty:
            return
        job = (await http.post("/v1/jobs", json=body, headers={"Prefer": "wait=60"})).json()
        while job.get("status") not in FINAL:
            await asyncio.sleep(0.05)
            polls[0] += 1
            job = (await http.get(f"/v1/jobs/{job['id']}")).json()
        if job["status"] != "succeeded":
            failed.append(job)


def run_jobs(base_url: str, n: int, clients: int, body: dict | None = None) -> dict:
    """Send `n` jobs from `clients` concurrent asyncio clients, each waiting for its job."""
    body = body or text_body()

    async def main() -> dict:
        q: asyncio.Queue = asyncio.Queue()
        for i in range(n):
            q.put_nowait(i)
        polls: list[int] = [0]
        failed: list[dict] = []
        async with httpx.AsyncClient(base_url=base_url, timeout=120,
                                     limits=httpx.Limits(max_connections=clients)) as http:
            await asyncio.gather(*(_client(http, body, q, polls, failed)
                                   for _ in range(clients)))
        return {"polls": polls[0], "failed": failed}

    return asyncio.run(main())


def scrape(url: str | None) -> str:
    if not url:
        return ""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read().decode()
    except OSError:
        return ""


def metric_sum(page: str, name: str) -> float:
    total = 0.0
    for line in page.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def model_cpu_ms(clients: int = 4, n: int = 300, body: dict | None = None
                 ) -> tuple[float, float | None]:
    """CPU ms per item of the model alone, and its mean (prefill) batch: the same engine
    (intake, operator graph, pools) run in this process, fed by `clients` closed-loop
    submitters, one torch thread as in the stack `run` measures. What the stack spends beyond
    this is the queue path. With `clients` = 1 every item runs alone: an upper bound on the
    model's share, whatever batches the stack formed."""
    import torch

    from services.worker import metrics
    from services.worker.engine.engine import Engine
    from services.worker.pipelines.factory import build_pipeline
    from services.worker.runtime import pick_device
    from shared.messages import TextItem
    from shared.registry import load_registry
    from shared.settings import get_settings

    torch.set_num_threads(1)
    body = body or text_body()
    settings = get_settings()
    spec = load_registry(settings.model_registry).get(body["model"])
    pipeline = build_pipeline(spec, pick_device(settings))
    pipeline.setup()
    engine = Engine(pipeline)
    inp = body["input"]
    item = TextItem(prompt=inp["prompts"][0], max_new_tokens=inp["max_new_tokens"])

    async def run(k: int) -> None:
        left = [k]

        async def one() -> None:
            while left[0] > 0:
                left[0] -= 1
                with engine.arrival() as arrival:
                    await arrival.submit(item)

        await asyncio.gather(*(one() for _ in range(clients)))

    def batches() -> tuple[float, float]:
        count = total = 0.0
        for m in metrics.BATCH_SIZE.collect():
            for sample in m.samples:
                if sample.labels.get("model") != spec.name:
                    continue
                if sample.name.endswith("_count"):
                    count += sample.value
                elif sample.name.endswith("_sum"):
                    total += sample.value
        return count, total

    async def main() -> tuple[float, float | None]:
        await run(50)
        c0, s0 = batches()
        t0 = time.process_time()
        await run(n)
        ms = (time.process_time() - t0) * 1000 / n
        c1, s1 = batches()
        return ms, (s1 - s0) / (c1 - c0) if c1 > c0 else None

    try:
        return asyncio.run(main())
    finally:
        pipeline.device_executor.shutdown(wait=False, cancel_futures=True)


def measure(target: Target, load: QueueLoad) -> dict[str, Any]:
    """Per-job Redis commands, CPU per process and jobs/s for `load.n` jobs through a running
    stack. Warm-up jobs run first; then the stack is measured idle (background commands and
    CPU per second), then under load; the MONITOR jobs split top-level commands from those run
    inside scripts."""
    pids, n, clients, body = target.pids, load.n, load.clients, load.body
    base_url, repeat, monitor_jobs = target.base_url, load.repeat, load.monitor_jobs
    r = redis.Redis(port=target.redis_port)
    run_jobs(base_url, load.warmup, clients, body)
    time.sleep(0.5)
    # The worker's model threads, by name (after the warm-up: pools start lazily).
    names = {pid: python_thread_names(pid) for pid in pids.get("worker", [])}

    def worker_threads() -> dict[str, float]:
        out: dict[str, float] = {}
        for pid, by_name in names.items():
            for tid, cpu in thread_cpu_seconds(pid).items():
                group = thread_group(by_name.get(tid, ""))
                out[group] = out.get(group, 0.0) + cpu
        return out

    def model_cpu() -> float:
        return sum(cpu for group, cpu in worker_threads().items() if group.startswith("model"))

    def cpu() -> dict[str, float]:
        out = {role: sum(cpu_seconds(p) for p in ps) for role, ps in pids.items()}
        t = os.times()
        out["client"] = t.user + t.system
        return out

    # Idle: what the background loops cost per second.
    c0, s0, t0 = cpu(), commandstats(r), time.monotonic()
    time.sleep(load.idle_seconds)
    c1, s1, t1 = cpu(), commandstats(r), time.monotonic()
    idle_s = t1 - t0
    idle_cmds = sum(c for c, _ in delta(s1, s0).values()) / idle_s
    idle_cpu = {k: (c1[k] - c0[k]) / idle_s for k in c0}

    # Load: `repeat` rounds of n jobs; commands over all of them, CPU and rate the median round.
    page0 = scrape(target.metrics_url)
    conns0 = connections_received(r)
    s0 = commandstats(r)
    rounds: list[_Round] = []
    polls, failed = 0, 0
    for _ in range(repeat):
        w0, c0, t0 = worker_threads(), cpu(), time.monotonic()
        done = run_jobs(base_url, n, clients, body)
        w1, c1, t1 = worker_threads(), cpu(), time.monotonic()
        polls, failed = polls + done["polls"], failed + len(done["failed"])
        threads = {k: (w1[k] - w0.get(k, 0.0)) * 1000 / n for k in w1}
        rounds.append(_Round(seconds=t1 - t0, threads=threads,
                             model=sum(v for k, v in threads.items() if k.startswith("model")),
                             cpu={k: (c1[k] - c0[k]) * 1000 / n for k in c0}))
    s1 = commandstats(r)
    conns1 = connections_received(r)
    page1 = scrape(target.metrics_url)
    jobs = n * repeat
    elapsed = statistics.median(x.seconds for x in rounds)
    by_name = delta(s1, s0)
    by_cmd = {k: c / jobs for k, (c, _) in sorted(by_name.items(), key=lambda kv: -kv[1][0])}
    usec = {k: u / jobs for k, (_, u) in by_name.items()}
    cpu_ms = {k: statistics.median(x.cpu[k] for x in rounds) for k in rounds[0].cpu}
    batches = (metric_sum(page1, "fibermill_batch_size_count")
               - metric_sum(page0, "fibermill_batch_size_count"))
    batched = (metric_sum(page1, "fibermill_batch_size_sum")
               - metric_sum(page0, "fibermill_batch_size_sum"))

    out: dict[str, Any] = {
        "n": n, "repeat": repeat, "clients": clients, "seconds": elapsed,
        "jobs_per_s": n / elapsed, "polls": polls, "failed": failed,
        "commands_per_job": sum(c for c, _ in by_name.values()) / jobs,
        "commands_by_cmd": by_cmd, "redis_usec_by_cmd": usec,
        "background_commands_per_job": idle_cmds * elapsed / n,
        "idle_commands_per_s": idle_cmds,
        "new_connections_per_job": (conns1 - conns0) / jobs,
        "cpu_ms_per_job": cpu_ms,
        "cpu_rounds": [x.cpu for x in rounds],
        "worker_threads_ms_per_job": {
            k: statistics.median(x.threads.get(k, 0.0) for x in rounds)
            for k in rounds[0].threads} if any(names.values()) else {},
        "idle_cpu_ms_per_s": {k: v * 1000 for k, v in idle_cpu.items()},
        "mean_batch": batched / batches if batches else None,
        # None when py-spy could not name the worker's threads
        "model_threads_ms_per_job": statistics.median(x.model for x in rounds)
        if any(is_model_thread(x) for v in names.values() for x in v.values()) else None,
    }
    if monitor_jobs:
        with Monitor(target.redis_port) as mon:
            run_jobs(base_url, monitor_jobs, clients, body)
            time.sleep(0.3)
        out["monitor_jobs"] = monitor_jobs
        out["top_level_by_cmd"] = {k: v / monitor_jobs for k, v in mon.top.most_common()}
        out["in_scripts_by_cmd"] = {k: v / monitor_jobs for k, v in mon.lua.most_common()}
    return out


# Report ---------------------------------------------------------------------------------------


def report(r: dict) -> list[str]:
    n = r["n"]
    lines = [f"{r.get('repeat', 1)} x {n} one-prompt {MODEL} jobs (4 new tokens), "
             f"{r['clients']} clients, Prefer: wait=60: {r['jobs_per_s']:.1f} jobs/s (median "
             f"round), {r['polls']} polls, {r['failed']} failed", ""]
    lines += ["Redis commands per job (INFO commandstats; commands inside scripts included):", "",
              "| command | per job | top-level | in scripts | Redis usec/job |",
              "|---|---|---|---|---|"]
    top, lua = r.get("top_level_by_cmd", {}), r.get("in_scripts_by_cmd", {})
    for cmd, per in r["commands_by_cmd"].items():
        lines.append(f"| {cmd} | {per:.2f} | {top.get(cmd, 0):.2f} | {lua.get(cmd, 0):.2f} | "
                     f"{r['redis_usec_by_cmd'][cmd]:.1f} |")
    lines.append(f"| **all** | **{r['commands_per_job']:.1f}** | "
                 f"**{sum(top.values()):.1f}** | **{sum(lua.values()):.1f}** | "
                 f"{sum(r['redis_usec_by_cmd'].values()):.0f} |")
    lines += ["", f"Background (idle): {r['idle_commands_per_s']:.1f} commands/s, "
              f"{r['background_commands_per_job']:.2f} per job at this rate; "
              f"per job net of it: "
              f"{r['commands_per_job'] - r['background_commands_per_job']:.1f}. "
              f"New Redis connections per job: {r['new_connections_per_job']:.3f}.", ""]
    lines += ["CPU ms per job (/proc utime+stime; the median round's; rounds: "
              + "; ".join(" ".join(f"{k} {v:.2f}" for k, v in x.items())
                          for x in r.get("cpu_rounds", [])) + "):", "",
              "| process | ms/job | idle ms/s |", "|---|---|---|"]
    cpu = r["cpu_ms_per_job"]
    for k, v in cpu.items():
        lines.append(f"| {k} | {v:.2f} | {r['idle_cpu_ms_per_s'][k]:.1f} |")
    stack_ms = sum(v for k, v in cpu.items() if k != "client")
    lines.append(f"| **stack (api+worker+redis)** | **{stack_ms:.2f}** | |")
    if r.get("model_threads_ms_per_job") is not None:
        m = r["model_threads_ms_per_job"]
        lines += [f"| model threads in the worker (device, cpu-op) | {m:.2f} | |",
                  f"| worker - model threads | {cpu['worker'] - m:.2f} | |",
                  f"| **queue path (stack - model threads)** | **{stack_ms - m:.2f}** | |"]
    if r.get("model_ms_per_job") is not None:
        m, m1 = r["model_ms_per_job"], r["model_ms_alone"]
        batch = f"{r['model_batch']:.1f}" if r.get("model_batch") else "-"
        lines += [f"| model in-process, {r['clients']} submitters (batch {batch}) | {m:.2f} | |",
                  f"| model in-process, one at a time (batch 1) | {m1:.2f} | |",
                  f"| worker - model | {cpu['worker'] - m1:.2f} .. {cpu['worker'] - m:.2f} | |",
                  f"| **queue path (stack - model)** | **{stack_ms - m1:.2f} .. "
                  f"{stack_ms - m:.2f}** | |"]
    if r.get("worker_threads_ms_per_job"):
        lines += ["", "Worker CPU ms per job by thread (named by py-spy dump):", "",
                  "| threads | ms/job |", "|---|---|"]
        for k, v in sorted(r["worker_threads_ms_per_job"].items(), key=lambda kv: -kv[1]):
            lines.append(f"| {k} | {v:.2f} |")
    if r.get("mean_batch"):
        lines.append(f"\nMean prefill batch in the stack: {r['mean_batch']:.2f}.")
    return lines


def run(load: QueueLoad, model: bool = True) -> dict[str, Any]:
    """The whole measurement on a stack of its own, with the in-process model run beside it
    (`model`) for the queue-path figure."""
    # One torch thread: the model's phase timings are then close to its CPU time.
    with bench_stack(MODEL, env={"OMP_NUM_THREADS": "1"}) as s:
        r = measure(Target(s.url, s.redis_port, s.serving_pids(), s.metrics_url), load)
    if model:
        r["model_ms_per_job"], r["model_batch"] = model_cpu_ms(load.clients, load.n)
        r["model_ms_alone"], _ = model_cpu_ms(1, load.n)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=300)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3, help="rounds of n jobs (median CPU)")
    ap.add_argument("--monitor-jobs", type=int, default=40)
    ap.add_argument("--celery-noop", action="store_true", help="also measure a bare Celery task")
    ap.add_argument("--no-model", action="store_true",
                    help="skip the in-process model run (no queue-path CPU figure)")
    ap.add_argument("--no-stack", action="store_true", help="only the Celery reference")
    args = ap.parse_args()
    if not args.no_stack:
        r = run(QueueLoad.from_args(args), model=not args.no_model)
        print("\n".join(report(r)))
    if args.celery_noop or args.no_stack:
        print()
        from benchmarks import celery_noop

        print("\n".join(celery_noop.report(celery_noop.measure(args.n))))


if __name__ == "__main__":
    main()
