"""A model of the size people serve, end to end, for `make bench`.

    python -m benchmarks.real_model [--requests 32] [--layers 24] [--out FILE]

Qwen2.5-0.5B's shape (benchmarks/qwen_shape.py: 24 layers, 2 KV heads of 64, 32,768
positions, seeded random weights, bf16 on disk) in a registry with `max_batch` 32 and no KV
budget, so the worker sizes its cache by the CPU default. Chat-like requests: prompts of 50 to
400 tokens and budgets of 32 to 256 new tokens, seeded, greedy, each one prompt. Contenders,
in one run, one at a time (the others frozen, peers.py says why), over the same requests:

- transformers `generate` in process at batch 32: the requests cut into batches of 32 in
  order, each padded on the left and run to its largest budget (static batching);
- LitServe (`max_batch_size` 32, `batch_timeout` 10 ms) running that `generate` in its own
  process, 32 closed-loop clients;
- Fibermill end to end (Redis, API, one CPU worker), 32 closed-loop clients, one job each
  (`Prefer: wait`).

Beside the speeds: what the worker holds once the model is loaded (its resident memory
against the weights and the KV pool), and how full the pages of the running rows were while
Fibermill served (the worker's fibermill_kv_cache_tokens over 16 x pages used, sampled every
0.2 s).
"""

import argparse
import asyncio
import contextlib
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import aiohttp
import httpx
import yaml

from benchmarks import qwen_shape
from benchmarks.isolated import isolated
from benchmarks.peer_servers import Server, litserve_available, litserve_server
from benchmarks.peers import LITSERVE_BATCH_TIMEOUT, Load, _turn, closed_loop, final_job, ratio
from benchmarks.stack import bench_stack

BATCH = 32
PROMPT_TOKENS = (50, 400)
NEW_TOKENS = (32, 256)
SEED = 0
PAGE_TOKENS = 16  # the worker's (services/worker/engine/text_cache.py)


@dataclass(frozen=True)
class Request:
    prompt: str
    prompt_tokens: int
    max_new_tokens: int


def requests(n: int, seed: int = SEED) -> list[Request]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(*PROMPT_TOKENS)
        out.append(Request(qwen_shape.words(rng, length), length, rng.randint(*NEW_TOKENS)))
    return out


def write_registry(path: Path, model_dir: Path, name: str) -> Path:
    entry = {"kind": "causal-lm", "path": str(model_dir),
             "description": "Qwen2.5-0.5B's shape, seeded random weights (benchmarks)",
             "limits": {"max_new_tokens": NEW_TOKENS[1]}, "max_batch": BATCH}
    path.write_text(yaml.safe_dump({"models": {name: entry}}, sort_keys=False))
    return path


# Contenders ----------------------------------------------------------------------------------


def measure_generate(model_dir: Path, reqs: Sequence[Request]) -> Load:
    """Static batching with `generate` in process, after a small warm-up batch. A request's
    latency is its batch's time. Run it through `isolated`."""
    from benchmarks import hf_generate

    model, tokenizer = hf_generate.load(model_dir)
    hf_generate.generate(model, tokenizer, [r.prompt for r in reqs[:2]], [4, 4])
    latencies = [0.0] * len(reqs)
    tokens: list[int | None] = [None] * len(reqs)
    t0 = time.perf_counter()
    for start in range(0, len(reqs), BATCH):
        batch = reqs[start:start + BATCH]
        t = time.perf_counter()
        out = hf_generate.generate(model, tokenizer, [r.prompt for r in batch],
                                   [r.max_new_tokens for r in batch])
        took = time.perf_counter() - t
        for i, (_, n) in enumerate(out, start):
            latencies[i], tokens[i] = took, n
    return Load(time.perf_counter() - t0, latencies, tokens)


def _serve(send_factory, url: str, reqs: Sequence[Request]) -> Load:
    async def main() -> Load:
        connector = aiohttp.TCPConnector(limit=BATCH + 8)
        timeout = aiohttp.ClientTimeout(total=3600)
        async with aiohttp.ClientSession(url, connector=connector, timeout=timeout) as http:
            send = send_factory(http, reqs)
            return await closed_loop(send, list(range(len(reqs))), BATCH)

    return asyncio.run(main())


def fibermill_send(model: str):
    def make(http: aiohttp.ClientSession, reqs: Sequence[Request]):
        async def send(i: int) -> int | None:
            body = {"task": "text-generation", "model": model,
                    "input": {"prompts": [reqs[i].prompt],
                              "max_new_tokens": reqs[i].max_new_tokens}}
            async with http.post("/v1/jobs", json=body, headers={"Prefer": "wait=60"}) as r:
                r.raise_for_status()
                job = await r.json()
            job = await final_job(http, job)
            if job["status"] != "succeeded":
                raise RuntimeError(f"job {job['id']} {job['status']}: {job.get('error')}")
            return (job.get("output") or [{}])[0].get("tokens")

        return send

    return make


def litserve_send(http: aiohttp.ClientSession, reqs: Sequence[Request]):
    async def send(i: int) -> int | None:
        body = {"prompt": reqs[i].prompt, "max_new_tokens": reqs[i].max_new_tokens}
        async with http.post("/predict", json=body) as r:
            r.raise_for_status()
            return (await r.json()).get("tokens")

    return send


# What the worker holds -----------------------------------------------------------------------


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and every process below it."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += proc.memory_info().rss
    return total


def scrape(metrics_url: str, model: str) -> dict[str, float]:
    """The worker's KV-cache gauges for `model`."""
    wanted = {"fibermill_kv_cache_pages", "fibermill_kv_cache_pages_used",
              "fibermill_kv_cache_tokens", "fibermill_kv_cache_preemptions_total",
              "fibermill_kv_cache_rows_waiting"}
    out: dict[str, float] = {}
    for line in httpx.get(metrics_url, timeout=10).text.splitlines():
        name, _, rest = line.partition("{")
        if name in wanted and f'model="{model}"' in rest:
            out[name] = float(line.rsplit(" ", 1)[1])
    return out


@dataclass
class Occupancy:
    samples: list[tuple[float, float]] = field(default_factory=list)  # (tokens, pages used)

    def ratios(self) -> list[float]:
        return [t / (PAGE_TOKENS * p) for t, p in self.samples if p]


def sample_occupancy(metrics_url: str, model: str, stop: threading.Event, into: Occupancy,
                     period: float = 0.2) -> None:
    while not stop.wait(period):
        try:
            got = scrape(metrics_url, model)
        except httpx.HTTPError:
            continue
        into.samples.append((got.get("fibermill_kv_cache_tokens", 0.0),
                             got.get("fibermill_kv_cache_pages_used", 0.0)))


# The run -------------------------------------------------------------------------------------


def _log(msg: str) -> None:
    print(f"[real-model {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(n: int = BATCH, layers: int = 24) -> dict:
    out: dict = {"n": n, "layers": layers, "errors": []}
    reqs = requests(n)
    out["prompt_tokens"] = [r.prompt_tokens for r in reqs]
    out["budgets"] = [r.max_new_tokens for r in reqs]
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fibermill-real-") as tmp_name:
        tmp = Path(tmp_name)
        _log("building the model")
        model_dir = qwen_shape.build(tmp / qwen_shape.NAME, layers=layers)
        registry = write_registry(tmp / "registry.yaml", model_dir, qwen_shape.NAME)
        out["weights_bytes"] = _weight_bytes(model_dir)
        env = {"FIBERMILL_MODEL_REGISTRY": str(registry), "FIBERMILL_CPU_WORKERS": "1"}
        with bench_stack(qwen_shape.NAME, env=env, logdir=tmp) as st:
            stack = Server(st.url, st.procs)
            out["worker_rss"] = tree_rss(st.workers.pid)
            out["pool"] = scrape(st.metrics_url, qwen_shape.NAME)
            servers = [stack]
            litserve = None
            if litserve_available():
                litserve_cm = litserve_server(model_dir, tmp, BATCH, LITSERVE_BATCH_TIMEOUT,
                                              timeout=3600)
                try:
                    litserve = litserve_cm.__enter__()
                    servers.append(litserve)
                except Exception as exc:
                    out["errors"].append(f"LitServe: {exc!r}")
                    litserve = None
            else:
                out["errors"].append("LitServe is not installed (pip install -e '.[bench]')")
            try:
                _log(f"generate in process, {n} requests")
                out["generate"] = _turn(lambda: isolated(measure_generate, model_dir, reqs),
                                        servers)()
                if litserve is not None:
                    _log("LitServe, c=32")
                    out["litserve"] = _turn(partial(_serve, litserve_send, litserve.url, reqs),
                                            [stack])()
                _log("Fibermill, c=32")
                occupancy, stop = Occupancy(), threading.Event()
                sampler = threading.Thread(target=sample_occupancy, daemon=True, args=(
                    st.metrics_url, qwen_shape.NAME, stop, occupancy))
                sampler.start()
                try:
                    out["fibermill"] = _turn(partial(
                        _serve, fibermill_send(qwen_shape.NAME), st.url, reqs),
                        [litserve] if litserve else [])()
                finally:
                    stop.set()
                    sampler.join()
                out["occupancy"] = occupancy.ratios()
                out["after"] = scrape(st.metrics_url, qwen_shape.NAME)
            finally:
                if litserve is not None:
                    litserve_cm.__exit__(None, None, None)
    out["seconds"] = time.perf_counter() - t_start
    return out


def _weight_bytes(model_dir: Path) -> int:
    """The weights' bytes once loaded in float32 (the CPU's `dtype: auto`)."""
    from safetensors import safe_open

    total = 0
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        names = f.keys()  # a safetensors file iterates by its keys() only
        for key in names:
            shape = f.get_slice(key).get_shape()
            total += 4 * _numel(shape)
    return total


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# The report ----------------------------------------------------------------------------------


def _gb(x: float) -> str:
    return f"{x / 1e9:.2f} GB"


def report(r: dict) -> list[str]:
    gen, lit, fm = r.get("generate"), r.get("litserve"), r.get("fibermill")
    pool = r.get("pool", {})
    pages = pool.get("fibermill_kv_cache_pages", 0)
    # 24 layers x keys and values x 2 heads x 64 x 4 bytes, per token
    token_bytes = r["layers"] * 2 * 2 * 64 * 4
    pool_bytes = (pages + 1) * PAGE_TOKENS * token_bytes
    fixed = BATCH * qwen_shape.CONTEXT * token_bytes
    occ = r.get("occupancy") or []
    lines = [
        f"## A model of the size people serve: Qwen2.5-0.5B's shape ({r['layers']} layers)", "",
        f"From benchmarks/real_model.py, in one run: {r['layers']} layers, 2 KV heads of 64,",
        "32,768 positions, seeded random weights (bf16 on disk, float32 on the CPU by",
        "`dtype: auto`),",
        f"`max_batch` 32 and no KV budget in the registry. {r['n']} chat-like requests, one "
        "prompt each, greedy:",
        f"prompts {min(r['prompt_tokens'])}-{max(r['prompt_tokens'])} tokens (mean "
        f"{statistics.fmean(r['prompt_tokens']):.0f}), budgets {min(r['budgets'])}-"
        f"{max(r['budgets'])} new tokens (mean {statistics.fmean(r['budgets']):.0f}).", "",
        "Memory once loaded:", "",
        "| what | value |", "|---|---|",
        f"| weights, float32 | {_gb(r['weights_bytes'])} |",
        f"| KV pool (the CPU default budget, 4 GiB) | {_gb(pool_bytes)}, {pages:.0f} pages of "
        f"{PAGE_TOKENS} tokens |",
        f"| the same cache as fixed slots, 32 x 32,768 tokens | {_gb(fixed)} |",
        f"| worker resident (launcher and worker process) | {_gb(r['worker_rss'])} |",
        f"| of which neither weights nor pool (interpreter, libraries, Celery) | "
        f"{_gb(r['worker_rss'] - r['weights_bytes'] - pool_bytes)} |",
        "",
        "Served, the same requests (c=32 clients; `generate` in batches of 32 in order):", "",
        "| contender | seconds | req/s | new tokens/s | p50 latency (s) | tokens/req |",
        "|---|---|---|---|---|---|",
    ]
    for name, load in (("transformers `generate`, batch 32, in process", gen),
                       ("LitServe, `generate` batched (32, 10 ms)", lit),
                       ("Fibermill end to end", fm)):
        if load is None:
            lines.append(f"| {name} | - | - | - | - | - |")
            continue
        made = sum(t or 0 for t in load.tokens)
        lines.append(f"| {name} | {load.seconds:.1f} | {load.rps:.3f} | "
                     f"{made / load.seconds:.1f} | {load.p50:.1f} | "
                     f"{load.mean_tokens or 0:.1f} |")
    lines += [
        "",
        f"Fibermill / `generate`: **{ratio(fm and fm.rps, gen and gen.rps)}** (target >= 0.9x); "
        f"Fibermill / LitServe: **{ratio(fm and fm.rps, lit and lit.rps)}** (target >= 1.0x).",
        "",
    ]
    if occ:
        lines.append(
            f"Pages of the running rows while Fibermill served: tokens held / tokens of their "
            f"pages, median **{statistics.median(occ):.3f}** (min {min(occ):.3f}, "
            f"{len(occ)} samples; target >= 0.9); preemptions "
            f"{r.get('after', {}).get('fibermill_kv_cache_preemptions_total', 0):.0f}.")
    for err in r["errors"]:
        lines.append(f"\nNot measured: {err}")
    lines.append(f"\nThis section took {r['seconds'] / 60:.1f} min.")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.real_model", description=__doc__)
    ap.add_argument("--requests", type=int, default=BATCH)
    ap.add_argument("--layers", type=int, default=24, help="fewer for a quick run")
    ap.add_argument("--out", type=Path, help="write the report here too")
    args = ap.parse_args()
    lines = report(run(args.requests, args.layers))
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
