"""`make bench`: latency of one-prompt jobs through a real local stack, written to
docs/benchmarks.md with the machine and the date."""

import argparse
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import redis

from benchmarks import (
    engine,
    kv_memory,
    openai_compat,
    outputs,
    peers,
    prefix_cache,
    queue_cost,
    real_model,
    replication_cost,
    span_work,
    structured_output,
    trace_cost,
)
from benchmarks.lifecycle import cancel_to_free, webhook_latency
from benchmarks.machine import machine
from benchmarks.stack import bench_stack
from shared.settings import REPO_ROOT

FINAL = {"succeeded", "failed", "canceled"}


def run_job(http: httpx.Client, body: dict) -> float:
    t0 = time.perf_counter()
    job = http.post("/v1/jobs", json=body).json()
    while job["status"] not in FINAL:
        time.sleep(0.002)
        job = http.get(f"/v1/jobs/{job['id']}").json()
    assert job["status"] == "succeeded", job
    return time.perf_counter() - t0


def measure(http: httpx.Client, body: dict, n: int) -> dict:
    run_job(http, body)  # warm-up
    xs = sorted(run_job(http, body) for _ in range(n))
    return {"n": n, "median": statistics.median(xs), "p90": xs[int(0.9 * (n - 1))],
            "min": xs[0], "max": xs[-1]}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    ap.add_argument("-n", type=int, default=30)
    ap.add_argument("--burst", type=int, default=32, help="jobs per burst in the engine ratios")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "benchmarks.md")
    ap.add_argument("--peers", choices=("full", "quick", "skip"), default="full",
                    help="the peers section (peers.py): full, a short smoke run, or none")
    ap.add_argument("--no-real-model", action="store_true",
                    help="leave out the Qwen2.5-0.5B-shaped section (real_model.py, ~20 min)")
    args = ap.parse_args()
    # Every model in the registry; webhooks to the benchmark's own receiver on localhost.
    with (bench_stack(env={"FIBERMILL_WEBHOOK_ALLOW_PRIVATE": "true"}) as stack,
          httpx.Client(base_url=stack.url, timeout=60) as http):
        rows = {
            "tiny-gpt2, 1 prompt, 8 new tokens": measure(http, {
                "task": "text-generation", "model": "tiny-gpt2",
                "input": {"prompts": ["Hello there"], "max_new_tokens": 8}}, args.n),
            "digits, 1 image, 50 steps": measure(http, {
                "task": "image-generation", "model": "digits",
                "input": {"prompts": ["7"], "seed": 1}}, args.n),
        }
        stack_redis = redis.Redis(port=stack.redis_port)
        lifecycle = {
            "cancel of a running 50-step digits image, until its worker lets go":
                cancel_to_free(http, stack_redis, 10),
            "`completed` webhook, from the job's completed_at to the receiver":
                webhook_latency(http, args.n),
        }
        oai_figures = openai_compat.run(stack.url)
    output_figures = outputs.run(args.n)
    queue_figures = queue_cost.run(queue_cost.QueueLoad(n=400, clients=32))
    engine_figures = engine.run(n=args.burst)
    peer_figures = None
    if args.peers != "skip":
        peer_figures = peers.run(peers.QUICK if args.peers == "quick" else peers.FULL)
    kv_figures = kv_memory.run()
    prefix_figures = prefix_cache.run()
    structured_figures = structured_output.run()
    replication_figures = replication_cost.run()
    trace_figures = trace_cost.run()
    span_figures = span_work.run()
    real_figures = None if args.no_real_model else real_model.run()
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Benchmarks", "",
        "Produced by `make bench` (benchmarks/__main__.py and the modules beside it):",
        "a local stack (Redis, API, one CPU worker). Latency: jobs submitted one at a time,",
        "from POST to `succeeded` as the client sees it (polling every 2 ms).", "",
        f"Machine: {machine()}. Date: {when}.", "",
        "| job | n | median (s) | p90 (s) | min (s) | max (s) |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['n']} | {r['median']:.3f} | {r['p90']:.3f} | "
                     f"{r['min']:.3f} | {r['max']:.3f} |")
    lines += ["", "Job lifecycle, in milliseconds:", "",
              "| what | n | median (ms) | p90 (ms) | min (ms) | max (ms) |",
              "|---|---|---|---|---|---|"]
    for name, r in lifecycle.items():
        lines.append(f"| {name} | {r['n']} | {r['median'] * 1000:.1f} | {r['p90'] * 1000:.1f} "
                     f"| {r['min'] * 1000:.1f} | {r['max'] * 1000:.1f} |")
    lines += ["", *outputs.report(output_figures)]
    lines += ["", *openai_compat.report(oai_figures)]
    lines += ["", "## Engine: batching, and what the queue costs", "",
              *engine.report(engine_figures)]
    lines += ["", "## The queue path: Redis commands and CPU per job", "",
              "From benchmarks/queue_cost.py, on a stack of its own (py-spy, in the "
              "`bench` extra, names the worker's model threads).", "",
              *queue_cost.report(queue_figures)]
    if peer_figures is not None:
        lines += ["", *peers.report(peer_figures, header=True, machine=machine())]
    lines += ["", *kv_memory.report(kv_figures)]
    lines += ["", *prefix_cache.report(prefix_figures)]
    lines += ["", *structured_output.report(structured_figures)]
    lines += ["", *replication_cost.report(replication_figures)]
    lines += ["", *trace_cost.report(trace_figures), "", *span_work.report(span_figures)]
    if real_figures is not None:
        lines += ["", *real_model.report(real_figures)]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
