"""Text decoding on one device: Fibermill's decoder against transformers' own continuous
batching and static `generate`, on the same requests (`make bench-gpu` runs it on CUDA).

    python -m benchmarks.decoders [--device cuda] [--shape gpt2|6x256|tiny]
        [-n 128] [--out FILE]

transformers ships continuous batching of its own (`init_continuous_batching`: a paged cache,
and on CUDA its own attention kernels and CUDA graphs). On a 2-core CPU it ran uniform 64-token
requests on the 6x256 GPT-2 at a quarter of static `generate`'s speed, so the decoder here
does not use it; this is where the choice is measured again on a GPU. Every contender gets
every request at once (offline throughput) and decodes greedily, each request to its own budget:

- static: `generate`, batches of 32 in order, each run to its longest budget (hf_generate);
- transformers CB: its manager, each request added with its own `max_new_tokens`, after a
  warm-up pass (on CUDA, graphs are captured then);
- Fibermill: the worker's engine in process (the decoder, 32 cache slots), every item
  submitted at once, after a warm-up pass.

Workloads: uniform (64 new tokens) and mixed (uniform in 8..128, peers.py's seed). Reported
per contender: req/s, generated tokens/s, and how many requests gave the same text as static
`generate`'s batch. A contender that fails is reported with its error, and the others still
run: a GPU is lent for minutes, not for a second try. `--device cpu --shape tiny` is a smoke
run anywhere.
"""

import argparse
import asyncio
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from benchmarks import gpt2_6x256
from benchmarks.isolated import with_engine
from benchmarks.peers import BATCH, mixed_budgets, static_batches

SHAPES = {"gpt2": (12, 768, 12), "6x256": (6, 256, 4)}  # layers, width, heads
UNIFORM = 64


@dataclass
class Run:
    seconds: float
    texts: list[str]
    tokens: list[int]


@dataclass
class Outcome:
    name: str
    run: Run | None = None
    error: str | None = None


def model_dir(shape: str, tmp: Path) -> Path:
    if shape == "tiny":
        from modelbuild.tiny_gpt2 import build

        build(tmp / "tiny-gpt2")
        return tmp / "tiny-gpt2"
    layers, width, heads = SHAPES[shape]
    return gpt2_6x256.build(tmp / shape, layers=layers, width=width, heads=heads)


def prompts(n: int) -> list[str]:
    return [f"Item {i} says" for i in range(n)]


def timed(fn: Callable[[], tuple[list[str], list[int]]], sync: Callable[[], None]) -> Run:
    sync()
    t = time.perf_counter()
    texts, tokens = fn()
    sync()
    return Run(time.perf_counter() - t, texts, tokens)


def run_static(path: Path, device: str, dtype, budgets: list[int]) -> Run:
    from benchmarks import hf_generate

    model, tokenizer = hf_generate.load(path, device)
    model.to(dtype)
    texts = prompts(len(budgets))

    def all_batches() -> tuple[list[str], list[int]]:
        out: list[tuple[str, int]] = []
        for batch in static_batches(budgets):
            out += hf_generate.generate(model, tokenizer, [texts[i] for i in batch],
                                        [budgets[i] for i in batch])
        return [t for t, _ in out], [n for _, n in out]

    hf_generate.generate(model, tokenizer, texts[:BATCH], [8] * min(BATCH, len(texts)))
    return timed(all_batches, _sync(device))


def run_transformers_cb(path: Path, device: str, dtype, budgets: list[int]) -> Run:
    import copy

    import torch

    from benchmarks import hf_generate

    model, tokenizer = hf_generate.load(path, device)
    model.to(dtype)
    config = copy.deepcopy(model.generation_config)
    # -1: no EOS, so every request makes its whole budget, as the other contenders' do.
    config.update(do_sample=False, eos_token_id=-1, pad_token_id=tokenizer.pad_token_id,
                  max_new_tokens=max(budgets))
    ids = [tokenizer(p)["input_ids"] for p in prompts(len(budgets))]

    def collect(manager, todo: list[int]) -> tuple[list[str], list[int]]:
        names = [manager.add_request(ids[i], request_id=f"r{k}-{i}",
                                     max_new_tokens=budgets[i]) for k, i in enumerate(todo)]
        done: dict[str, list[int]] = {}
        while len(done) < len(names):
            result = manager.get_result(timeout=60)
            if result is None:
                raise RuntimeError(f"transformers CB gave {len(done)} of {len(names)} results")
            if result.is_finished():
                done[result.request_id] = list(result.generated_tokens)
        rows = [done[name] for name in names]
        return ([tokenizer.decode(r, skip_special_tokens=True) for r in rows],
                [len(r) for r in rows])

    with torch.inference_mode(), model.continuous_batching_context_manager(
            generation_config=config, block=True, timeout=10) as manager:
        collect(manager, list(range(min(BATCH, len(budgets)))))
        return timed(lambda: collect(manager, list(range(len(budgets)))), _sync(device))


def run_fibermill(path: Path, device: str, dtype, budgets: list[int]) -> Run:
    import torch

    from shared.messages import TextItem
    from shared.registry import ModelSpec

    spec = ModelSpec(name="bench-decoder", kind="causal-lm", path=path, max_batch=BATCH,
                     pool_sets=1, dtype=str(dtype).removeprefix("torch."))
    items = [TextItem(prompt=p, max_new_tokens=b)
             for p, b in zip(prompts(len(budgets)), budgets, strict=True)]
    sync = _sync(device)

    async def main(engine) -> Run:
        async def everything(todo: list[TextItem]) -> tuple[list[str], list[int]]:
            results = await asyncio.gather(*(engine.submit(i) for i in todo))
            return [r.text for r in results], [r.tokens for r in results]

        await everything(items[:BATCH])
        sync()
        t = time.perf_counter()
        texts, tokens = await everything(items)
        sync()
        return Run(time.perf_counter() - t, texts, tokens)

    return with_engine(spec, main, device=torch.device(device))


CONTENDERS = {"static generate": run_static, "transformers CB": run_transformers_cb,
              "Fibermill": run_fibermill}


def _sync(device: str) -> Callable[[], None]:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.synchronize
    return lambda: None


def measure(path: Path, device: str, budgets: list[int]) -> list[Outcome]:
    """Every contender on `budgets`; one that raises is reported with its error."""
    import torch

    dtype = torch.float16 if device.startswith("cuda") else torch.float32
    out = []
    for name, fn in CONTENDERS.items():
        try:
            out.append(Outcome(name, fn(path, device, dtype, budgets)))
        except Exception as exc:
            last = traceback.format_exception_only(exc)[-1].strip()
            out.append(Outcome(name, error=last[:300]))
    return out


def report(results: dict[str, list[Outcome]], budgets: dict[str, list[int]]) -> list[str]:
    lines = []
    for workload, outcomes in results.items():
        b = budgets[workload]
        lines += ["", f"{workload}: {len(b)} requests, {sum(b)} tokens asked for "
                  f"(mean {statistics.fmean(b):.0f})", "",
                  "| contender | req/s | generated tokens/s | vs static generate | "
                  "same text as static generate |", "|---|---|---|---|---|"]
        static = next((o.run for o in outcomes if o.name == "static generate"), None)
        for o in outcomes:
            if o.run is None:
                lines.append(f"| {o.name} | failed: {o.error} | | | |")
                continue
            r = o.run
            rps = len(r.tokens) / r.seconds
            versus = f"{static.seconds / r.seconds:.2f}x" if static else "-"
            same = (f"{sum(a == c for a, c in zip(r.texts, static.texts, strict=True))}"
                    f"/{len(r.texts)}" if static else "-")
            lines.append(f"| {o.name} | {rps:.1f} | {sum(r.tokens) / r.seconds:.0f} | "
                         f"{versus} | {same} |")
    return lines


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", choices=[*SHAPES, "tiny"], default="gpt2")
    ap.add_argument("-n", type=int, default=128, help="requests per workload")
    ap.add_argument("--out", type=Path, help="append the report to this file")
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run it where one is, or pass --device cpu")
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    budgets = {"uniform": [UNIFORM] * args.n, "mixed": mixed_budgets(args.n)}
    with tempfile.TemporaryDirectory() as tmp:
        path = model_dir(args.shape, Path(tmp))
        results = {w: measure(path, args.device, b) for w, b in budgets.items()}
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"## Text decoders on {name}", "",
             f"torch {torch.__version__}, {when}: GPT-2 of shape {args.shape} (random weights), "
             f"greedy, every request to its own budget, all submitted at once; batches or "
             f"slots of {BATCH} (benchmarks/decoders.py).",
             *report(results, budgets)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with args.out.open("a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
