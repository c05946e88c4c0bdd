"""How well the paged KV cache uses a budget, for `make bench`.

    python -m benchmarks.kv_memory

tiny-gpt2 (1,024 positions) with a KV budget of exactly one full-context row (64 pages of 16
tokens) and `max_batch` 64, in process: 48 greedy rows of one length (a short prompt and
budget summing to `length`) submitted together, for lengths of 64, 128 and 256 tokens. After
every decoder iteration while rows still wait (the pool, not the queue, is what limits), it
counts the rows running and the tokens they hold against the tokens of their pages. With
fixed slots of the model's context, one such budget runs one row at a time.
"""

import argparse
import asyncio
import statistics
from dataclasses import dataclass
from pathlib import Path

from benchmarks.isolated import isolated, with_engine
from shared.settings import REPO_ROOT

MODEL_DIR = REPO_ROOT / "models" / "tiny-gpt2"
CONTEXT = 1024
PAGE_TOKENS = 16
ROW_PAGES = CONTEXT // PAGE_TOKENS
# 2 layers x keys and values x 64 wide x 4 bytes, per token
PAGE_BYTES = 2 * 2 * 64 * 4 * PAGE_TOKENS
ROWS = 48
LENGTHS = (64, 128, 256)
PROMPT = "the quick brown fox jumps"


@dataclass
class Sitting:
    length: int
    rows_at_once: list[int]  # per iteration while rows waited
    occupancy: list[float]
    preemptions: int
    tokens: list[int]  # new tokens each row made

    @property
    def ideal(self) -> float:
        return ROW_PAGES * PAGE_TOKENS / self.length


def measure(length: int, rows: int = ROWS) -> Sitting:
    """One sitting, in this process: call it through `isolated`."""
    from services.worker import metrics
    from shared.messages import TextItem
    from shared.registry import ModelKind, ModelSpec

    name = f"tiny-gpt2-kv-{length}"
    spec = ModelSpec(name=name, kind=ModelKind.CAUSAL_LM, path=MODEL_DIR, max_batch=64,
                     kv_cache_bytes=ROW_PAGES * PAGE_BYTES)

    async def main(engine) -> Sitting:
        decoder = engine.scheduling
        prompt_tokens = len(decoder.p.tokenizer(PROMPT).input_ids)
        item = TextItem(prompt=PROMPT, max_new_tokens=length - prompt_tokens)
        at_once: list[int] = []
        occupancy: list[float] = []
        iterate = decoder._iterate

        def watched(admit):
            settles = iterate(admit)
            if decoder.running and (decoder.waiting or decoder.returned or admit):
                at_once.append(len(decoder.running))
                held = sum(r.columns for r in decoder.running)
                occupancy.append(held / (PAGE_TOKENS * decoder.cache.used))
            return settles

        decoder._iterate = watched
        preempted = metrics.KV_PREEMPTIONS.labels(name)
        before = preempted._value.get()
        results = await asyncio.gather(*(engine.submit(item) for _ in range(rows)))
        return Sitting(length, at_once, occupancy, int(preempted._value.get() - before),
                       [r.tokens for r in results])

    return with_engine(spec, main)


def run(lengths: tuple[int, ...] = LENGTHS) -> list[Sitting]:
    return [isolated(measure, length) for length in lengths]


def report(sittings: list[Sitting]) -> list[str]:
    lines = [
        "## The KV cache under a budget of one full-context row", "",
        "From benchmarks/kv_memory.py: tiny-gpt2 (1,024 positions), a KV budget of one "
        "full-context row",
        f"(64 pages of 16 tokens), `max_batch` 64, in process; {ROWS} greedy rows of one length "
        "submitted together;",
        "figures over the decoder's iterations while rows still waited. Fixed slots of the "
        "model's context",
        "would run one row at a time in this budget.", "",
        "| row length (tokens) | rows at once, median | budget / length | ratio (target >= 0.9) "
        "| tokens held / tokens of their pages, median | preemptions | new tokens a row, min |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in sittings:
        rows = statistics.median(s.rows_at_once) if s.rows_at_once else 0
        occ = statistics.median(s.occupancy) if s.occupancy else 0
        lines.append(f"| {s.length} | {rows:.0f} | {s.ideal:.1f} | {rows / s.ideal:.2f} | "
                     f"{occ:.3f} | {s.preemptions} | {min(s.tokens)} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.kv_memory", description=__doc__)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    lines = report(run())
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
