"""What tracing costs, for `make bench`.

    python -m benchmarks.trace_cost [--jobs 600] [--rounds 30] [--sessions 5] [--threads 1]
        [--stacks traced,own,sampled,plain,again] [--out FILE]

Five stacks (Redis, API and one CPU worker each, tiny-gpt2), alike but for the OTEL_*
variables: one traces every job as deployed (OTLP over HTTP to a receiver in a process of its
own, benchmarks/span_sink.py, which counts what it is sent: an export that nobody takes would
cost retries instead), one the same without the HTTP server spans
(OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=fastapi: the job's own spans only), one as deployed with
one job in ten sampled (OTEL_TRACES_SAMPLER=parentbased_traceidratio), and two have no
exporter (the no-op tracer: shared/tracing.py): the second measures how far two stacks alike
come out apart, in the same run. Measured in turns, the others frozen (processes.frozen), in
sessions that each start the stacks anew, the order turned by one from the last (where a stack
starts in that order moved its speed by up to 8%: two alike came out that far apart), the
rounds' orders balanced so that each stack follows each other as often (`balanced_orders`), bursts
of one-prompt jobs from 32 closed-loop clients (`Prefer: wait`), as
benchmarks/replication_cost.py does, each worker with one intra-op thread as the peers
benchmark runs tiny-gpt2 (`--threads 0`: the cores, the default; docs/architecture.md, "Threads
of a CPU worker": with two on these two cores an OpenMP team stalls whenever the API preempts
it, and any CPU the API spends costs the model's steps again). Reported: jobs/s, p50 latency
and the CPU a job took of the stack's processes on each, in all and by process (the API's
does not move with how the worker's batches form, so it shows the API's share of the cost
plainly), each traced stack's ratio to the untraced one round by round (the median, a 95%
interval drawing whole sessions, and the quartiles: a stack's jobs/s moves by a fifth from one
burst to the next as its batches form, so a cost of a few percent needs many rounds to tell)
and the spans exported per job.
"""

import argparse
import asyncio
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.one_prompt_bursts import CLIENTS, MODEL, NEW_TOKENS, Side, burst
from benchmarks.procstat import cpu_seconds
from benchmarks.stack import BenchStack, bench_stack
from services.devstack.processes import frozen
from services.devstack.redis_server import free_port

# Exported within half a second of a span's end (the SDK's default waits 5 s), so the spans a
# burst made are counted by the burst's end.
SCHEDULE_DELAY_MS = 500


@dataclass
class TracedSide(Side):
    spans_per_job: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)  # of the stack's processes, a job
    # by process (api, worker, redis), a job: the API's does not move with how batches form
    role_ms: dict[str, list[float]] = field(default_factory=dict)


def _stack_cpu(stack: BenchStack) -> dict[str, float]:
    """CPU seconds of the stack's API, worker and Redis so far, by role."""
    return {role: sum(cpu_seconds(pid) for pid in pids)
            for role, pids in stack.serving_pids().items()}


class SpanSink:
    """The receiver the traced stacks export to: benchmarks/span_sink.py, in a process of its
    own (a collector runs apart from the stack and from the load's clients)."""

    def __init__(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._proc = subprocess.Popen([sys.executable, "-m", "benchmarks.span_sink", str(port)])
        deadline = time.monotonic() + 30
        while True:
            try:
                self.spans  # noqa: B018 (answers once it is up)
                return
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError("the span sink did not start") from None
                time.sleep(0.05)

    @property
    def spans(self) -> int:
        """The spans it has been sent so far."""
        with urllib.request.urlopen(f"{self.url}/spans", timeout=30) as r:
            return int(r.read())

    def close(self) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=10)


TRACED, OWN, SAMPLED, PLAIN, AGAIN = "traced", "own", "sampled", "plain", "again"
STACKS = (TRACED, OWN, SAMPLED, PLAIN, AGAIN)
COMPARED = (TRACED, OWN, SAMPLED, AGAIN)  # each against PLAIN


def run(jobs: int = 600, rounds: int = 30, threads: int | None = 1,
        stacks: Sequence[str] = STACKS, sessions: int = 5) -> dict:
    """`stacks`: which of STACKS to measure (PLAIN always); fewer, more rounds in the time.
    `rounds` split among `sessions`, each with stacks started anew."""
    sink = SpanSink()
    try:
        with tempfile.TemporaryDirectory(prefix="fibermill-trace-cost-") as tmp:
            return _measure(sink, Path(tmp), jobs, rounds, threads, {*stacks, PLAIN},
                            max(1, sessions))
    finally:
        sink.close()


# Head sampling as docs/operations.md suggests for a fleet of small models: one job in ten.
SAMPLE_RATIO = 0.1


def _envs(sink: SpanSink) -> dict[str, dict[str, str]]:
    traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.url,
              "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
              "OTEL_BSP_SCHEDULE_DELAY": str(SCHEDULE_DELAY_MS)}
    return {TRACED: traced,
            OWN: {**traced, "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "fastapi"},
            SAMPLED: {**traced, "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                      "OTEL_TRACES_SAMPLER_ARG": str(SAMPLE_RATIO)},
            PLAIN: {"OTEL_TRACES_EXPORTER": "none"},
            AGAIN: {"OTEL_TRACES_EXPORTER": "none"}}


def _measure(sink: SpanSink, tmp: Path, jobs: int, rounds: int, threads: int | None,
             stacks: set[str], sessions: int) -> dict:
    sides = {TRACED: TracedSide("traced (OTLP/HTTP)"),
             OWN: TracedSide("traced, the job's spans only (no HTTP server spans)"),
             SAMPLED: TracedSide(f"traced as deployed, {SAMPLE_RATIO:.0%} of jobs sampled "
                                 "(parentbased_traceidratio)"),
             PLAIN: TracedSide("not traced (no exporter)"),
             AGAIN: TracedSide("not traced, a second stack alike (the measure's own spread)")}
    sides = {k: side for k, side in sides.items() if k in stacks}
    envs = [(k, env) for k, env in _envs(sink).items() if k in stacks]
    # Where a stack stands in the order the stacks start in moves its speed from its start to
    # its end: an untraced stack started first or last came out 1.03x-1.08x of one alike
    # started between (2026-12-07, over 30-80 rounds of 2-12 sessions that reversed the
    # order). Each session starts them anew, the order turned by one from the last, so that
    # over as many sessions as stacks each stack starts in each place once.
    per_session = -(-rounds // sessions)
    for session in range(sessions):
        turn = session % len(envs)
        started = envs[turn:] + envs[:turn]
        _session(dict(started), sides, sink, tmp / f"s{session}", jobs, per_session, threads,
                 first=session * per_session)
    ratios = {k: [t / p for t, p in zip(sides[k].rps, sides[PLAIN].rps, strict=True)]
              for k in COMPARED if k in sides}
    return {"jobs": jobs, "rounds": len(sides[PLAIN].rps), "threads": threads, "sides": sides,
            "sessions": sessions, "ratios": ratios,
            "ratio": {k: statistics.median(v) for k, v in ratios.items()}}


def balanced_orders(n: int) -> list[list[int]]:
    """Orders of n stacks for rounds in turn (a Williams design): each stack takes each place,
    and follows each other stack right after it, equally often over the orders. Turning one
    order by one each round left every stack behind the same other in every round, and a
    stack's speed can depend on the one measured before it: two untraced stacks alike, the
    one measured after the traced stack, came out 1.01-1.04x apart in every run that way."""
    head, low, high = [0], 1, n - 1
    while len(head) < n:
        head.append(low)
        low += 1
        if len(head) < n:
            head.append(high)
            high -= 1
    orders = [[(x + i) % n for x in head] for i in range(n)]
    return orders + [order[::-1] for order in orders] if n % 2 else orders


def median_interval(xs: Sequence[float], sessions: int = 0,
                    resamples: int = 2000) -> tuple[float, float]:
    """A 95% bootstrap interval of the median of `xs`, rounds in `sessions` equal runs of
    them (0: each round its own): whole sessions are drawn, as a session's rounds share its
    stacks' speed. A fixed seed: a report reads the same for the same rounds."""
    n = len(xs) // sessions if sessions else 1
    groups = [xs[i:i + n] for i in range(0, len(xs), n)]
    draw = random.Random(0)
    medians = sorted(statistics.median([x for g in draw.choices(groups, k=len(groups))
                                        for x in g]) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def _session(envs: dict[str, dict[str, str]], sides: dict[str, TracedSide], sink: SpanSink,
             tmp: Path, jobs: int, rounds: int, threads: int | None, first: int = 0) -> None:
    """Start the stacks in `envs`' order and measure `rounds` rounds of them into `sides`,
    the first of them the run's round `first` (the orders of the rounds go on from there)."""
    with ExitStack() as running:
        stacks: dict[str, BenchStack] = {
            k: running.enter_context(bench_stack(MODEL, threads=threads, env=env,
                                                 logdir=tmp / k))
            for k, env in envs.items()}

        def others(k: str) -> list:
            return [p for o, st in stacks.items() if o != k for p in st.procs]

        for k in stacks:  # warm-up: each model's first bursts are slower
            with frozen(others(k)):
                asyncio.run(burst(stacks[k].url, jobs // 4))
        order = sorted(stacks, key=list(sides).index)  # the same turns in each session
        turns = balanced_orders(len(order))
        for r in range(rounds):
            for k in (order[i] for i in turns[(first + r) % len(turns)]):
                before = sink.spans
                with frozen(others(k)):
                    cpu = _stack_cpu(stacks[k])
                    rps, p50 = asyncio.run(burst(stacks[k].url, jobs))
                    # Read before a traced stack's wait below: a stack idle takes ~15 ms of
                    # CPU a second (timers, polls), which only the traced ones would count;
                    # the export of the burst's last spans (~1 ms) is left out instead.
                    after = _stack_cpu(stacks[k])
                    if k not in (PLAIN, AGAIN):  # its last spans exported before it is frozen
                        time.sleep(2 * SCHEDULE_DELAY_MS / 1000)
                side = sides[k]
                side.rps.append(rps)
                side.p50.append(p50)
                side.cpu_ms.append((sum(after.values()) - sum(cpu.values())) / jobs * 1000)
                for role, seconds in after.items():
                    side.role_ms.setdefault(role, []).append((seconds - cpu[role]) / jobs * 1000)
                side.spans_per_job.append((sink.spans - before) / jobs)
                print(f"[trace-cost {time.strftime('%H:%M:%S')}] {side.name}: {rps:.1f} jobs/s",
                      file=sys.stderr, flush=True)


def report(r: dict) -> list[str]:
    lines = [
        "## Tracing: what a trace per job costs", "",
        f"From benchmarks/trace_cost.py: {len(r['sides'])} stacks alike but for the OTEL_* "
        f"variables (traced ones export over OTLP/HTTP to a receiver on this machine), "
        f"measured in turns in {r.get('sessions', 2)} sessions, each starting the stacks anew "
        f"in an order turned by one from the last, the rounds in orders where each stack "
        f"follows each other as often; "
        f"{r['rounds']} rounds of {r['jobs']} one-prompt {MODEL} jobs "
        f"({NEW_TOKENS} new tokens) from {CLIENTS} clients; "
        f"{_threads(r.get('threads'))} intra-op thread(s) a worker.", "",
        "| stack | jobs/s (median) | jobs/s (quartiles) | p50 latency (ms) | "
        "CPU a job (ms, median) | of it API / worker / Redis | spans per job |",
        "|---|---|---|---|---|---|---|",
    ]
    for side in r["sides"].values():
        roles = " / ".join(f"{statistics.median(side.role_ms[role]):.2f}"
                           for role in ("api", "worker", "redis") if role in side.role_ms)
        lines.append(f"| {side.name} | {statistics.median(side.rps):.1f} | "
                     f"{_quartiles(side.rps, '.1f')} | "
                     f"{statistics.median(side.p50) * 1000:.0f} | "
                     f"{statistics.median(side.cpu_ms):.2f} | {roles or '-'} | "
                     f"{statistics.median(side.spans_per_job):.1f} |")
    lines.append("")
    for k, what in ((TRACED, "traced"), (OWN, "the job's spans only"),
                    (SAMPLED, f"traced, {SAMPLE_RATIO:.0%} sampled"),
                    (AGAIN, "of a second untraced stack")):
        if k not in r["ratios"]:
            continue
        low, high = median_interval(r["ratios"][k], r.get("sessions", 0))
        lines.append(f"Jobs/s {what} / not traced: **{r['ratio'][k]:.2f}x**, the median of "
                     f"the {len(r['ratios'][k])} rounds' ratios (95% interval {low:.2f}-"
                     f"{high:.2f}; quartiles {_quartiles(r['ratios'][k], '.2f')}; rounds: "
                     f"{', '.join(f'{x:.2f}' for x in r['ratios'][k])}).")
    return lines


def _threads(threads: int | None) -> str:
    return "the cores'" if threads is None else str(threads)


def _quartiles(xs: list[float], fmt: str) -> str:
    if len(xs) < 2:
        return format(xs[0], fmt) if xs else "-"
    q1, _, q3 = statistics.quantiles(xs, n=4)
    return f"{q1:{fmt}}-{q3:{fmt}}"


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.trace_cost", description=__doc__)
    ap.add_argument("--jobs", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--sessions", type=int, default=5,
                    help="runs of the rounds, each starting the stacks anew (best a multiple "
                         "of the stacks: each starts in each place as often)")
    ap.add_argument("--threads", type=int, default=1,
                    help="the workers' intra-op threads (0: the cores, the default's)")
    ap.add_argument("--stacks", default=",".join(STACKS),
                    help=f"which of {', '.join(STACKS)} to measure ({PLAIN} always)")
    ap.add_argument("--out", type=Path, help="write the report here too")
    args = ap.parse_args()
    stacks = [k.strip() for k in args.stacks.split(",") if k.strip()]
    if unknown := set(stacks) - set(STACKS):
        ap.error(f"--stacks: {', '.join(sorted(unknown))} not among {', '.join(STACKS)}")
    lines = report(run(args.jobs, args.rounds, args.threads or None, stacks, args.sessions))
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
