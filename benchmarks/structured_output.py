"""What decoding under a JSON schema costs a token, in process (the engine fed directly, as
isolated.engine_bursts does): bursts of 32 rows of the same prompts and budgets, unconstrained
against under `response_format` json_schema, each in a fresh interpreter, alternating.

Time per token is a burst's seconds over the tokens its rows made (a constrained row ends when
its JSON does, so the two make different counts). On the 6x256 GPT-2 of the benchmarks (a
step's work is the model's) and on tiny-gpt2 (a step is ~1 ms, so what the grammar adds
shows whole).

    python -m benchmarks.structured_output [--rounds 3]
"""

import argparse
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from benchmarks import gpt2_6x256
from benchmarks.isolated import isolated
from benchmarks.rounds import alternate
from shared.settings import REPO_ROOT

ROWS = 32
BUDGET = 64
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer"},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4},
    },
    "required": ["name", "age", "color", "tags"],
    "additionalProperties": False,
}


def _log(msg: str) -> None:
    print(f"[structured {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def per_token(model_dir: str, name: str, constrained: bool, bursts: int = 3) -> float:
    """Seconds per generated token: the median of `bursts` bursts after a warm-up one."""
    import torch

    from services.worker.engine.engine import Engine
    from services.worker.engine.results import TextResult
    from services.worker.pipelines.factory import build_pipeline
    from shared.messages import ResponseFormat, TextItem
    from shared.registry import ModelKind, ModelSpec

    spec = ModelSpec(name=name, kind=ModelKind.CAUSAL_LM, path=Path(model_dir), max_batch=ROWS)
    pipeline = build_pipeline(spec, torch.device("cpu"))
    pipeline.setup()
    fmt = ResponseFormat(type="json_schema", json_schema=SCHEMA) if constrained else None
    items = [TextItem(prompt=f"Person {i} as JSON:", max_new_tokens=BUDGET, temperature=0.8,
                      seed=i, response_format=fmt) for i in range(ROWS)]
    engine = Engine(pipeline)
    try:
        engine.run(items)
        times = []
        for _ in range(bursts):
            t0 = time.perf_counter()
            results = engine.run(items)
            tokens = sum(r.tokens for r in results if isinstance(r, TextResult))
            times.append((time.perf_counter() - t0) / tokens)
        return statistics.median(times)
    finally:
        pipeline.device_executor.shutdown(wait=True)


def run(rounds: int = 3) -> dict:
    out: dict = {"rounds": rounds}
    with tempfile.TemporaryDirectory(prefix="fibermill-structured-") as tmp:
        models = {gpt2_6x256.NAME: str(gpt2_6x256.build(Path(tmp) / gpt2_6x256.NAME)),
                  "tiny-gpt2": str(REPO_ROOT / "models" / "tiny-gpt2")}
        for name, path in models.items():
            _log(f"{name}: unconstrained and json_schema, {rounds} rounds")
            plain, schema = alternate(rounds, [partial(isolated, per_token, path, name, False),
                                               partial(isolated, per_token, path, name, True)])
            out[name] = (plain, schema)
    return out


def report(r: dict) -> list[str]:
    lines = [
        "## Structured output", "",
        f"benchmarks/structured_output.py: in process, bursts of {ROWS} sampled rows of up to "
        f"{BUDGET} tokens, unconstrained against `response_format` json_schema (an object of "
        "four typed members), each sitting in a fresh interpreter, alternating; seconds per "
        "generated token, median of each sitting's bursts.", "",
        "| model | unconstrained (ms/token) | json_schema (ms/token) | json_schema / "
        "unconstrained (median of rounds) |",
        "|---|---|---|---|",
    ]
    for name in (gpt2_6x256.NAME, "tiny-gpt2"):
        plain, schema = r[name]
        ratio = statistics.median(s / p for s, p in zip(schema, plain, strict=True))
        lines.append(f"| {name} | {statistics.median(plain) * 1000:.3f} | "
                     f"{statistics.median(schema) * 1000:.3f} | {ratio:.2f}x |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.structured_output",
                                 description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print("\n".join(report(run(args.rounds))))


if __name__ == "__main__":
    main()
