"""What waiting for a replica costs, for `make bench`.

    python -m benchmarks.replication_cost [--jobs 400] [--rounds 3] [--out FILE]

One Redis group with Sentinel (a primary, one replica, three sentinels, each a process:
services/devstack/redis_sentinel.py) and two stacks on it (API and one CPU worker each,
tiny-gpt2), alike but for FIBERMILL_REDIS_MIN_REPLICAS: 1 (a job's creation, each result and
its final state wait for the replica's acknowledgement, WAIT) and 0 (acknowledged by the
primary alone). Each on a database of its own, so neither's worker takes the other's work;
measured in turns, the other stack frozen (processes.frozen), bursts of one-prompt jobs from 32
closed-loop clients (`Prefer: wait`). Reported: jobs/s and p50 latency of each, and the ratio,
the median of the rounds' ratios (the machine's speed drifts between rounds).
"""

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.one_prompt_bursts import CLIENTS, MODEL, NEW_TOKENS, Side, burst
from benchmarks.stack import BenchStack, bench_stack
from services.devstack.processes import frozen
from services.devstack.redis_sentinel import SentinelGroup


def run(jobs: int = 400, rounds: int = 3) -> dict:
    with tempfile.TemporaryDirectory(prefix="fibermill-replication-") as tmp_name:
        tmp = Path(tmp_name)
        group = SentinelGroup(tmp / "redis", replicas=1)
        group.start()
        try:
            return _measure(group, tmp, jobs, rounds)
        finally:
            group.stop()


def _measure(group: SentinelGroup, tmp: Path, jobs: int, rounds: int) -> dict:
    sides = {1: Side("WAIT for 1 replica"), 0: Side("primary only")}
    stacks: dict[int, BenchStack] = {}
    with bench_stack(MODEL, env={**group.env(), "FIBERMILL_REDIS_URL": "redis://127.0.0.1/1",
                                 "FIBERMILL_REDIS_MIN_REPLICAS": "1"},
                     logdir=tmp / "wait") as waiting, \
         bench_stack(MODEL, env={**group.env(), "FIBERMILL_REDIS_URL": "redis://127.0.0.1/2",
                                 "FIBERMILL_REDIS_MIN_REPLICAS": "0"},
                     logdir=tmp / "nowait") as plain:
        stacks = {1: waiting, 0: plain}
        for replicas in (1, 0):  # warm-up: each model's first bursts are slower
            with frozen(stacks[1 - replicas].procs):
                asyncio.run(burst(stacks[replicas].url, jobs // 4))
        for r in range(rounds):
            for replicas in ((1, 0) if r % 2 == 0 else (0, 1)):
                with frozen(stacks[1 - replicas].procs):
                    rps, p50 = asyncio.run(burst(stacks[replicas].url, jobs))
                sides[replicas].rps.append(rps)
                sides[replicas].p50.append(p50)
                print(f"[replication {time.strftime('%H:%M:%S')}] {sides[replicas].name}: "
                      f"{rps:.1f} jobs/s", file=sys.stderr, flush=True)
    ratios = [w / p for w, p in zip(sides[1].rps, sides[0].rps, strict=True)]
    return {"jobs": jobs, "rounds": rounds, "sides": sides, "ratio": statistics.median(ratios),
            "ratios": ratios}


def report(r: dict) -> list[str]:
    lines = [
        "## Redis with Sentinel: what waiting for a replica costs", "",
        f"From benchmarks/replication_cost.py: one primary, one replica and three sentinels "
        f"(processes on this machine), two stacks on it alike but for "
        f"FIBERMILL_REDIS_MIN_REPLICAS, measured in turns; {r['rounds']} rounds of "
        f"{r['jobs']} one-prompt {MODEL} jobs ({NEW_TOKENS} new tokens) from {CLIENTS} "
        "clients.", "",
        "| writes acknowledged by | jobs/s (median) | rounds | p50 latency (ms) |",
        "|---|---|---|---|",
    ]
    for side in r["sides"].values():
        lines.append(f"| {side.name} | {statistics.median(side.rps):.1f} | "
                     f"{', '.join(f'{x:.1f}' for x in side.rps)} | "
                     f"{statistics.median(side.p50) * 1000:.0f} |")
    lines += ["", f"Jobs/s with WAIT / without: **{r['ratio']:.2f}x** (the median of the rounds' "
              f"ratios: {', '.join(f'{x:.2f}' for x in r['ratios'])})."]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.replication_cost",
                                 description=__doc__)
    ap.add_argument("--jobs", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, help="write the report here too")
    args = ap.parse_args()
    lines = report(run(args.jobs, args.rounds))
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
