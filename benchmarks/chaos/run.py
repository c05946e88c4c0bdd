"""`make chaos`: a nemesis run. A whole stack as separate processes (Redis with AOF, two API
replicas, the worker launcher with two workers, a webhook receiver) takes jobs while workers,
API replicas and Redis are killed, restarted and frozen; then every accepted job is checked
against the same job run without faults, and every webhook against its job. The failover
profiles run on Redis Sentinel instead (a primary, a replica, three sentinels:
sentinel_stack.py), killing the primary so that the sentinels promote the replica.

    python -m benchmarks.chaos.run --jobs 1000 --registry models/registry.yaml
        [--profile full|short|none|failover|failover-short] [--out docs/chaos.md]
        [--workdir run/chaos]

Exits non-zero when any job was lost, stuck, failed or wrong, a webhook was missing, unsigned
or contradicting its job, or a submission got a 5xx (tests/benchmarks/chaos/test_chaos.py runs a
short one). Logs of every process stay in the work directory.
"""

import argparse
import asyncio
import base64
import secrets
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.chaos import faults, jobs
from benchmarks.chaos.faults import FaultRunner
from benchmarks.chaos.load import Client, Tracker
from benchmarks.chaos.receiver import Receiver, judge_webhooks
from benchmarks.chaos.report import ChaosResult
from benchmarks.chaos.sentinel_stack import SentinelStack
from benchmarks.chaos.stack import Stack
from benchmarks.machine import machine
from services.devstack.redis_server import free_port, free_ports
from shared.settings import REPO_ROOT

QUIET_TIMEOUT = 240.0
SUBMIT_GIVE_UP = 150.0  # past the idempotency layer's 60 s for a claim whose creator died
WEBHOOK_GRACE = 20.0  # after the last job is final: backoff is capped at 4 s here
CHAOS_POLL_SECONDS = 3.0


@dataclass(frozen=True)
class ChaosConfig:
    registry: Path
    jobs: int = 1000
    profile: str = "full"
    period: float | None = None  # seconds to spread submissions over; None: the profile's
    combos: int = 30
    steps: int = 12
    settle: float = 60.0  # a job not final this long after the last fault is stuck
    patience: float = 30.0  # then: waiting stops once no job became final for this long
    drain: float = 300.0  # ... or after this long past `settle`
    concurrency: int = 64  # submissions in flight at once
    seed: int = 1
    workdir: Path = REPO_ROOT / "run" / "chaos"
    text_model: str = "tiny-gpt2"
    image_model: str = "digits"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ChaosConfig":
        return cls(registry=args.registry, jobs=args.jobs, profile=args.profile,
                   period=args.period, combos=args.combos, steps=args.steps,
                   settle=args.settle, patience=args.patience, drain=args.drain,
                   concurrency=args.concurrency, seed=args.seed, workdir=args.workdir)


@dataclass(frozen=True)
class Parts:
    """One run's parts, as every phase uses them."""

    cfg: ChaosConfig
    stack: Stack
    receiver: Receiver
    client: Client
    result: ChaosResult
    steps: list[faults.Step]
    period: float  # seconds the submissions are spread over


def stack_env(cfg: ChaosConfig, secret: str) -> dict[str, str]:
    """Short leases as in tests/e2e/conftest.py, so a killed worker's sub-requests come back
    within seconds; no rate limit (the run is the only client)."""
    return {
        "FIBERMILL_MODEL_REGISTRY": str(cfg.registry.resolve()),
        "FIBERMILL_WORKER_MODELS": f"{cfg.text_model},{cfg.image_model}",
        "FIBERMILL_LEASE_SECONDS": "3",
        "FIBERMILL_HEARTBEAT_SECONDS": "0.5",
        "FIBERMILL_JANITOR_INTERVAL_SECONDS": "0.5",
        "FIBERMILL_WORKER_HEARTBEAT_TTL_SECONDS": "3",
        "FIBERMILL_WORKER_METRICS_PORT": str(free_ports(2)),  # the Stack's two workers
        "FIBERMILL_DRAIN_SECONDS": "2",
        "FIBERMILL_LOG_LEVEL": "WARNING",
        "FIBERMILL_WEBHOOK_SECRET": secret,
        "FIBERMILL_WEBHOOK_ALLOW_PRIVATE": "true",
        "FIBERMILL_WEBHOOK_BACKOFF_BASE_SECONDS": "0.5",
        "FIBERMILL_WEBHOOK_BACKOFF_CAP_SECONDS": "4",
        "FIBERMILL_RATE_LIMIT_PER_MINUTE": "1000000",
        "FIBERMILL_RATE_LIMIT_BURST": "100000",
    }


def run(cfg: ChaosConfig) -> ChaosResult:
    """Start a stack, run the quiet and the chaos phase, stop it; the counts of what went
    wrong. Raises (with every log's tail) when the stack does not start or the quiet phase
    fails: then there is nothing to compare with."""
    jobs.check_models(cfg.registry, cfg.text_model, cfg.image_model)
    steps = faults.PROFILES[cfg.profile](cfg.period)
    period = cfg.period or (max(s.at for s in steps) + 2 if steps else 90.0)
    workdir = cfg.workdir / datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    secret = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
    result = ChaosResult(cfg.profile, cfg.jobs, cfg.combos)
    sentinel = cfg.profile in faults.SENTINEL_PROFILES
    stack = (SentinelStack if sentinel else Stack)(workdir, stack_env(cfg, secret))
    receiver = Receiver(free_port(), secret)
    t = time.monotonic()
    try:
        try:
            stack.start()
        except Exception as exc:
            raise RuntimeError(f"stack did not start: {exc}\n{stack.tails()}") from exc
        result.seconds["start"] = time.monotonic() - t
        asyncio.run(_phases(cfg, stack, receiver, steps, period, result))
    finally:
        receiver.close()
        stack.close()
        result.log_tracebacks = {str(p.relative_to(workdir)): n for p in stack.log_files()
                                 if (n := p.read_text(errors="replace").count("Traceback"))}
    result.seconds["total"] = time.monotonic() - t
    print(f"chaos run {workdir}: logs in {stack.logdir}", file=sys.stderr)
    return result


async def _phases(cfg: ChaosConfig, stack: Stack, receiver: Receiver,
                  steps: list[faults.Step], period: float, result: ChaosResult) -> None:
    client = Client(stack.api_urls, result)
    parts = Parts(cfg, stack, receiver, client, result, steps, period)
    try:
        t = time.monotonic()
        bodies = jobs.combos(cfg.combos, cfg.seed, cfg.text_model, cfg.image_model, cfg.steps)
        quiet_ids, expected = await _quiet(client, stack, bodies)
        result.seconds["quiet"] = time.monotonic() - t
        t = time.monotonic()
        accepted = await _chaos(parts, bodies, expected)
        # A retried POST whose Idempotency-Key did not hold made a job no answer names.
        extra = stack.stored_job_ids() - accepted - quiet_ids
        result.extra_jobs = len(extra)
        for job_id in sorted(extra)[:5]:
            result.example("extra_jobs", job_id)
        result.seconds["chaos"] = time.monotonic() - t
    finally:
        await client.aclose()


async def _quiet(client: Client, stack: Stack, bodies: list[dict]) -> tuple[set[str], list]:
    """Each body once, no faults: the outputs every chaos job must reproduce."""
    ids = []
    for n, body in enumerate(bodies):
        job_id = await client.submit(n, body, None, time.time() + 30)
        if job_id is None:
            raise RuntimeError(f"quiet phase: body {n} not accepted\n{stack.tails()}")
        ids.append(job_id)
    outputs: dict[str, list] = {}

    async def keep(job: dict) -> None:
        if job["status"] != "succeeded":
            raise RuntimeError(f"quiet phase: job {job['id']} {job['status']}: "
                               f"{job.get('error')}\n{stack.tails()}")
        outputs[job["id"]] = await jobs.read_outputs(job, client.fetch)

    tracker = Tracker(client, keep)
    for job_id in ids:
        tracker.add(job_id)
    deadline = time.monotonic() + QUIET_TIMEOUT
    await tracker.run_until(lambda: not tracker.pending or time.monotonic() > deadline)
    if tracker.pending:
        raise RuntimeError(f"quiet phase: {len(tracker.pending)} job(s) not final in "
                           f"{QUIET_TIMEOUT:.0f}s\n{stack.tails()}")
    return set(ids), [outputs[j] for j in ids]


async def _chaos(parts: Parts, bodies: list[dict], expected: list[list]) -> set[str]:
    """Submit and fault at once, then wait and judge; the ids of the accepted jobs."""
    cfg, client, receiver, result = parts.cfg, parts.client, parts.receiver, parts.result
    combo_of: dict[str, int] = {}

    async def check(job: dict) -> None:
        if job["status"] != "succeeded":
            result.failed += 1
            result.example("failed", f"{job['id']} {job['status']} {job.get('error')}")
            return
        try:
            got = await jobs.read_outputs(job, client.fetch)
        except Exception as exc:  # an output the job lists but cannot serve is wrong too
            result.wrong_output += 1
            result.example("wrong_output", f"{job['id']} unreadable: {exc}")
            return
        if not jobs.same_outputs(expected[combo_of[job["id"]]], got):
            result.wrong_output += 1
            result.example("wrong_output", job["id"])

    # A hinted job is read at once, the rest every few seconds (see Tracker).
    tracker = Tracker(client, check, every=CHAOS_POLL_SECONDS, hinted=receiver.job_ids)
    sem = asyncio.Semaphore(cfg.concurrency)
    run_tag = secrets.token_hex(4)
    t0 = time.time()
    runner = FaultRunner(parts.stack, parts.steps, t0, faults.PROFILE_KINDS[cfg.profile])
    runner.start()

    async def submit(n: int) -> None:
        await asyncio.sleep(max(0.0, t0 + n * parts.period / cfg.jobs - time.time()))
        combo = n % len(bodies)
        body = {**bodies[combo], "webhook": receiver.url}
        async with sem:
            job_id = await client.submit(n, body, f"chaos-{run_tag}-{n}",
                                         time.time() + SUBMIT_GIVE_UP)
        if job_id is None:
            result.not_accepted += 1
            return
        result.accepted += 1
        combo_of[job_id] = combo
        tracker.add(job_id)

    submitting = asyncio.gather(*(submit(n) for n in range(cfg.jobs)))
    try:
        await tracker.run_until(lambda: submitting.done() and not runner.is_alive())
        await submitting
    finally:
        runner.cancel()
        runner.finish()
    result.faults, result.last_fault_at = runner.log, runner.last_fault_at
    if isinstance(parts.stack, SentinelStack):
        result.failovers = list(parts.stack.failovers)
    result.missing_fault_kinds = runner.missing_kinds()
    result.fault_errors = (sum(not e.ok for e in runner.log) + len(result.missing_fault_kinds)
                           + sum(e.step.action == "start_api" and e.answered_after is None
                                 for e in runner.log))
    await _settle(cfg, tracker, t0 + (runner.last_fault_at or 0), result)
    completed = [datetime.fromisoformat(j["completed_at"]).timestamp()
                 for j in tracker.final.values() if j.get("completed_at")]
    result.last_final_at = max(completed) - t0 if completed else None
    await judge_webhooks(receiver, tracker.final, result, WEBHOOK_GRACE)
    return set(combo_of)


async def _settle(cfg: ChaosConfig, tracker: Tracker, last_fault: float,
                  result: ChaosResult) -> None:
    """Stuck is what is not final `settle` seconds after the last fault (or the last
    submission). Past that the run goes on waiting while jobs still become final, so that a
    slow recovery (a backlog the faults left) is told apart from jobs that never finish."""
    settle_at = max(last_fault, time.time()) + cfg.settle
    await tracker.run_until(lambda: not tracker.pending or time.time() > settle_at)
    stuck = set(tracker.pending)
    await tracker.run_until(lambda: not tracker.pending
                            or time.time() - tracker.last_final_at > cfg.patience
                            or time.time() > settle_at + cfg.drain)
    gone = tracker.gone & tracker.pending
    result.lost = len(gone)
    result.stuck = len(stuck - gone)
    result.never_final = len(tracker.pending - gone)
    for job_id in sorted(gone):
        result.example("lost", job_id)
    for job_id in sorted(tracker.pending - gone):
        result.example("never_final", job_id)
    for job_id in sorted(stuck - tracker.pending):
        result.example("stuck", f"{job_id} (final later)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.chaos.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--registry", type=Path, default=REPO_ROOT / "models" / "registry.yaml")
    p.add_argument("--profile", choices=sorted(faults.PROFILES), default="full")
    p.add_argument("--period", type=float, help="seconds to spread submissions over "
                   "(default: the fault schedule's length)")
    p.add_argument("--combos", type=int, default=30, help="distinct bodies (and seeds)")
    p.add_argument("--steps", type=int, default=12, help="denoising steps of image jobs")
    p.add_argument("--settle", type=float, default=60.0,
                   help="seconds after the last fault before a job counts as stuck")
    p.add_argument("--patience", type=float, default=30.0,
                   help="after --settle, keep waiting while a job became final this recently")
    p.add_argument("--drain", type=float, default=300.0,
                   help="after --settle, wait at most this long for the stuck jobs")
    p.add_argument("--concurrency", type=int, default=64, help="submissions in flight")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workdir", type=Path, default=REPO_ROOT / "run" / "chaos")
    p.add_argument("--out", type=Path, help="also write the table to this file")
    a = p.parse_args(argv)
    result = run(ChaosConfig.from_args(a))
    table = result.markdown()
    print(table)
    if a.out:
        when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        header = (f"<!-- Written by `make chaos` (benchmarks/chaos/run.py) on {machine()}, "
                  f"{when}. What it means: docs/reliability.md. -->")
        a.out.write_text(f"{header}\n\n{table}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
