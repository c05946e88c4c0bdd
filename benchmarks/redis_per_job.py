"""What one job costs the Redis primary: commands by name and CPU, the figures that size a
primary and tell when to shard (docs/operations.md, "Redis with Sentinel").

    .venv/bin/python -m benchmarks.redis_per_job -n 500

Starts a local stack (benchmarks/stack.py: Redis, the API, one CPU worker serving tiny-gpt2)
plus one replica of its Redis, with FIBERMILL_REDIS_MIN_REPLICAS=1 so the writes that make a job
wait for the replica as they do under Sentinel. Sends `n` one-prompt jobs, then `n` two-prompt
jobs, from a few clients with `Prefer: wait=60`, and reports per job:

- calls by command (INFO commandstats). Redis counts the commands a Lua script runs under their
  own names too: the `in scripts` column (from a MONITOR sample of a few more jobs) says how
  many of them ran inside EVALSHA rather than being sent by a client;
- usec by command (commandstats). EVALSHA's usec includes the commands it runs, so the column
  does not add up to the CPU;
- the primary's main-thread CPU (INFO cpu): what Redis's one thread spends, parsing and
  replication included, the figure that bounds jobs/s.

The background loops (joiner, janitor, heartbeats, Celery's polling) cost commands per second,
not per job: measured idle beforehand and subtracted over the run's duration.
"""

import argparse
import asyncio
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import redis

from benchmarks.machine import machine
from benchmarks.redis_stats import Monitor, commandstats, delta
from benchmarks.stack import bench_stack
from services.devstack.processes import stop
from services.devstack.redis_server import free_port, start_redis

MODEL = "tiny-gpt2"
FINAL = {"succeeded", "failed", "canceled"}
SCRIPTS = {"evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "script"}
QUEUE = {
    "lpush",
    "rpush",
    "brpop",
    "rpop",
    "lpop",
    "llen",
    "lrem",
    "lrange",
    "brpoplpush",
    "lmove",
    "blmove",
}
CATEGORY_ORDER = ("script", "queue", "replication", "other")


def body(prompts: int) -> dict:
    return {
        "task": "text-generation",
        "model": MODEL,
        "input": {"prompts": ["Hello there"] * prompts, "max_new_tokens": 4},
    }


def category(name: str) -> str:
    if name in SCRIPTS:
        return "script"
    if name in QUEUE:
        return "queue"
    if name in ("wait", "replconf", "psync", "sync"):
        return "replication"
    return "other"


def run_jobs(base_url: str, n: int, prompts: int, clients: int) -> None:
    async def client(http: httpx.AsyncClient, left: list[int]) -> None:
        while left[0] > 0:
            left[0] -= 1
            job = (
                await http.post("/v1/jobs", json=body(prompts), headers={"Prefer": "wait=60"})
            ).json()
            while job.get("status") not in FINAL:
                await asyncio.sleep(0.05)
                job = (await http.get(f"/v1/jobs/{job['id']}")).json()
            if job["status"] != "succeeded":
                raise RuntimeError(f"job did not succeed: {job}")

    async def main() -> None:
        left = [n]
        async with httpx.AsyncClient(
            base_url=base_url, timeout=120, limits=httpx.Limits(max_connections=clients)
        ) as http:
            await asyncio.gather(*(client(http, left) for _ in range(clients)))

    asyncio.run(main())


def main_thread_cpu_us(r: redis.Redis) -> float:
    cpu = r.info("cpu")
    return 1e6 * (float(cpu["used_cpu_user_main_thread"]) + float(cpu["used_cpu_sys_main_thread"]))


def wait_for_replica(r: redis.Redis, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if int(r.info("replication")["connected_slaves"]) >= 1:
            return
        time.sleep(0.1)
    raise RuntimeError("the replica did not connect")


def measure(
    r: redis.Redis,
    base_url: str,
    n: int,
    prompts: int,
    clients: int,
    idle_per_s: dict[str, tuple[float, float]],
    idle_cpu_per_s: float,
) -> dict:
    before, cpu0, t0 = commandstats(r), main_thread_cpu_us(r), time.monotonic()
    run_jobs(base_url, n, prompts, clients)
    seconds = time.monotonic() - t0
    calls = delta(commandstats(r), before)
    per_job = {}
    for name, (c, u) in calls.items():
        ic, iu = idle_per_s.get(name, (0.0, 0.0))
        pc, pu = (c - ic * seconds) / n, (u - iu * seconds) / n
        if pc >= 0.005:
            per_job[name] = (pc, max(pu, 0.0))
    cpu = (main_thread_cpu_us(r) - cpu0 - idle_cpu_per_s * seconds) / n
    return {"per_job": per_job, "cpu_us": cpu, "jobs_per_s": n / seconds}


def in_scripts_per_job(
    r: redis.Redis, port: int, base_url: str, jobs: int, prompts: int
) -> dict[str, float]:
    with Monitor(port) as mon:
        run_jobs(base_url, jobs, prompts, clients=2)
        time.sleep(0.5)
    return {name: count / jobs for name, count in mon.lua.items()}


def report(
    results: dict[int, dict],
    lua: dict[int, dict[str, float]],
    n: int,
    idle_cpu_per_s: float,
    idle_calls_per_s: float,
) -> str:
    names = sorted(
        {name for res in results.values() for name in res["per_job"]},
        key=lambda x: (CATEGORY_ORDER.index(category(x)), x),
    )
    head = "| command | kind |" + "".join(
        f" {p}-prompt calls/job | in scripts | usec/job |" for p in results
    )
    lines = [head, "|---|---|" + "---:|---:|---:|" * len(results)]
    for name in names:
        row = f"| {name.upper()} | {category(name)} |"
        for p, res in results.items():
            c, u = res["per_job"].get(name, (0.0, 0.0))
            row += f" {c:.2f} | {lua[p].get(name, 0.0):.2f} | {u:.1f} |"
        lines.append(row)
    lines.append("")
    for p, res in results.items():
        total = sum(c for c, _ in res["per_job"].values())
        sent = total - sum(lua[p].values())
        lines.append(
            f"- {p}-prompt jobs ({n}): {total:.1f} commands/job counted by Redis, "
            f"about {sent:.1f} of them sent by clients; primary main-thread CPU "
            f"{res['cpu_us']:.0f} us/job; {res['jobs_per_s']:.1f} jobs/s "
            "(this stack's one CPU worker is the limit, not Redis)"
        )
    lines.append(
        f"- idle (no jobs): {idle_calls_per_s:.0f} commands/s, "
        f"{idle_cpu_per_s / 1000:.1f} ms of Redis CPU per second (subtracted above)"
    )
    lines.append(f"- {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {machine()}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=500, help="jobs of each shape")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--monitor-jobs", type=int, default=50)
    args = parser.parse_args()
    env = {"FIBERMILL_REDIS_MIN_REPLICAS": "1"}
    with bench_stack(models=MODEL, env=env) as stack, tempfile.TemporaryDirectory() as tmp:
        replica = start_redis(
            free_port(),
            Path(tmp),
            appendonly=False,
            args=["--replicaof", "127.0.0.1", str(stack.redis_port)],
            start_new_session=True,
        )
        try:
            r = redis.Redis(port=stack.redis_port)
            wait_for_replica(r)
            run_jobs(stack.url, 40, 2, args.clients)  # warm-up: scripts loaded, model compiled
            idle0, cpu0 = commandstats(r), main_thread_cpu_us(r)
            time.sleep(args.idle_seconds)
            idle = {
                k: (c / args.idle_seconds, u / args.idle_seconds)
                for k, (c, u) in delta(commandstats(r), idle0).items()
            }
            idle_cpu = (main_thread_cpu_us(r) - cpu0) / args.idle_seconds
            results = {
                p: measure(r, stack.url, args.n, p, args.clients, idle, idle_cpu) for p in (1, 2)
            }
            lua = {
                p: in_scripts_per_job(r, stack.redis_port, stack.url, args.monitor_jobs, p)
                for p in (1, 2)
            }
        finally:
            stop([replica])
    print(report(results, lua, args.n, idle_cpu, sum(c for c, _ in idle.values())))


if __name__ == "__main__":
    main()
