"""Prefix caching, end to end: a real local stack (Redis, API, one CPU worker) serving the
6x256 GPT-2 of the benchmarks (gpt2_6x256.py, 1,024 positions, `max_batch` 32).

- Batch: `lines` completion requests through the Batch API (/v1/files, /v1/batches), each a
  400-token system prompt and a short question, 8 tokens each (greedy): once with one system
  prompt for every line, once with a distinct system prompt of the same length per line; from
  the batch's creation to `completed`.
- Interactive: streamed /v1/completions one after another, the same 400-token system prompt and
  a short question each, against a distinct system prompt each: time to the first streamed
  token (p50), after a warm-up request each.

The hit rate is the worker's fibermill_kv_prefix_hit_tokens over its lookups.

    python -m benchmarks.prefix_cache [--lines 1000] [--ttft 40]
"""

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from benchmarks import gpt2_6x256
from benchmarks.stack import bench_stack

PREFIX_TOKENS = 400
NEW_TOKENS = 8
WORDS = ["system", "user", "answer", "question", "careful", "short", "reply", "model", "please",
         "context", "number", "value", "table", "column", "order", "field", "record", "sample",
         "result", "report", "summary", "detail"]


def _log(msg: str) -> None:
    print(f"[prefix-cache {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def prefixes(model_dir: Path, count: int, seed: int) -> list[str]:
    """`count` system prompts of PREFIX_TOKENS tokens each, of seeded random words (distinct
    from their first page on)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    rng = random.Random(seed)
    out = []
    for i in range(count):
        words = f"System prompt {i}: " + " ".join(rng.choice(WORDS) for _ in range(PREFIX_TOKENS))
        text = str(tok.decode(tok(words)["input_ids"][:PREFIX_TOKENS]))
        out.append(text + "\n")
    return out


def questions(count: int) -> list[str]:
    return [f"Question {i}: what is {i} plus {i % 7}? Answer:" for i in range(count)]


def write_registry(path: Path, model_dir: Path) -> Path:
    entry = {"kind": "causal-lm", "path": str(model_dir), "max_batch": 32,
             "description": "GPT-2, 6 layers x 256 wide, seeded random weights (benchmarks)"}
    path.write_text(yaml.safe_dump({"models": {gpt2_6x256.NAME: entry}}, sort_keys=False))
    return path


def run_batch(http: httpx.Client, path: Path, lines: int) -> dict:
    with path.open("rb") as f:
        file_id = http.post("/v1/files", files={"file": ("in.jsonl", f)},
                            data={"purpose": "batch"}).raise_for_status().json()["id"]
    t0 = time.perf_counter()
    batch = http.post("/v1/batches", json={"input_file_id": file_id,
                                           "endpoint": "/v1/completions",
                                           "completion_window": "24h"}).raise_for_status().json()
    while batch["status"] not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(0.25)
        batch = http.get(f"/v1/batches/{batch['id']}").raise_for_status().json()
    seconds = time.perf_counter() - t0
    counts = batch.get("request_counts") or {}
    if batch["status"] != "completed" or counts.get("completed") != lines:
        raise RuntimeError(f"batch {batch['id']} {batch['status']}: {counts}")
    return {"seconds": seconds, "lines": lines}


def batch_file(path: Path, systems: list[str], asks: list[str]) -> Path:
    with path.open("w") as f:
        for i, ask in enumerate(asks):
            body = {"model": gpt2_6x256.NAME, "prompt": systems[i % len(systems)] + ask,
                    "max_tokens": NEW_TOKENS, "temperature": 0}
            f.write(json.dumps({"custom_id": f"r{i}", "method": "POST",
                                "url": "/v1/completions", "body": body}) + "\n")
    return path


def first_token(http: httpx.Client, prompt: str) -> float:
    """Seconds from the request to the first streamed chunk that carries a token."""
    body = {"model": gpt2_6x256.NAME, "prompt": prompt, "max_tokens": NEW_TOKENS,
            "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    first = None
    with http.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if first is None and line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if any(c.get("text") for c in chunk.get("choices", [])):
                    first = time.perf_counter() - t0
    if first is None:
        raise RuntimeError("no token was streamed")
    return first


def hit_rate(metrics_url: str) -> tuple[float, float]:
    text = httpx.get(metrics_url).text

    def value(name: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name + "{"))

    return (value("fibermill_kv_prefix_hit_tokens_total"),
            value("fibermill_kv_prefix_lookup_tokens_total"))


def run(lines: int = 1000, ttft: int = 40) -> dict:
    out: dict = {"lines": lines, "ttft": ttft}
    with tempfile.TemporaryDirectory(prefix="fibermill-prefix-") as tmp_name:
        tmp = Path(tmp_name)
        model_dir = gpt2_6x256.build(tmp / gpt2_6x256.NAME)
        registry = write_registry(tmp / "registry.yaml", model_dir)
        asks = questions(max(lines, ttft + 1))
        # The batch's distinct prompts, then the interactive ones (never cached before).
        distinct = prefixes(model_dir, lines + ttft + 1, seed=1)
        shared = prefixes(model_dir, 1, seed=2)
        env = {"FIBERMILL_MODEL_REGISTRY": str(registry), "FIBERMILL_CPU_WORKERS": "1"}
        with (bench_stack(gpt2_6x256.NAME, env=env, logdir=tmp) as st,
              httpx.Client(base_url=st.url, timeout=600) as http):
            for name, systems in (("distinct", distinct[:lines]), ("shared", shared)):
                _log(f"batch of {lines} lines, {name} system prompts")
                before = hit_rate(st.metrics_url)
                out[("batch", name)] = run_batch(
                    http, batch_file(tmp / f"{name}.jsonl", systems, asks[:lines]), lines)
                after = hit_rate(st.metrics_url)
                out[("batch hits", name)] = (after[0] - before[0]) / max(1.0, after[1] - before[1])
            for name, systems in (("distinct", distinct[lines:]), ("shared", shared)):
                _log(f"{ttft} streamed completions, {name} system prompts")
                first_token(http, systems[-1 % len(systems)] + asks[-1])  # warm-up
                out[("ttft", name)] = [first_token(http, systems[i % len(systems)] + asks[i])
                                       for i in range(ttft)]
    return out


def report(r: dict) -> list[str]:
    d, s = r[("batch", "distinct")]["seconds"], r[("batch", "shared")]["seconds"]
    td, ts = (statistics.median(r[("ttft", k)]) for k in ("distinct", "shared"))
    return [
        "## Prefix caching", "",
        f"benchmarks/prefix_cache.py: the 6x256 GPT-2 (`max_batch` 32) on a stack of its own. "
        f"Batch: {r['lines']} /v1/completions lines through the Batch API, a "
        f"{PREFIX_TOKENS}-token system prompt and a short question each, {NEW_TOKENS} greedy "
        f"tokens; interactive: {r['ttft']} streamed completions one at a time (after a warm-up), "
        "time to the first token.", "",
        "| workload | distinct system prompts | one shared system prompt | shared / distinct |",
        "|---|---|---|---|",
        f"| batch, creation to completed (s) | {d:.1f} | {s:.1f} | {d / s:.2f}x faster |",
        f"| prefix hit rate (hit / looked-up tokens) | {r[('batch hits', 'distinct')]:.3f} | "
        f"{r[('batch hits', 'shared')]:.3f} | |",
        f"| interactive, p50 time to first token (ms) | {td * 1000:.1f} | {ts * 1000:.1f} | "
        f"{ts / td:.2f}x |",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.prefix_cache", description=__doc__)
    ap.add_argument("--lines", type=int, default=1000)
    ap.add_argument("--ttft", type=int, default=40)
    args = ap.parse_args()
    print("\n".join(report(run(args.lines, args.ttft))))


if __name__ == "__main__":
    main()
