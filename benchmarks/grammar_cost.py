"""What decoding under a JSON schema costs, per grammar library, on this project's tokenizers.

    .venv/bin/python -m benchmarks.grammar_cost [--walks 20] [--no-qwen]

For xgrammar, llguidance and outlines-core (each measured where installed; llguidance is the
project's, the others are `pip install xgrammar outlines-core` away), on the tokenizers of
tiny-gpt2 (1,000 tokens), pydoc-gpt2 (4,096) and the Qwen-shaped 151,936-token vocabulary
(benchmarks/qwen_shape.py), for a schema of an object with a string, an integer, an enum and
an array of strings, all required:

- setup: the tokenizer's view the library builds once per model (s);
- compile: one new schema, the library's own cache off (ms);
- fill and advance, per token (us): the mask of the allowed tokens written into a bitmask row,
  and the state advanced past the token written, on two walks: `doc`, the tokens of JSON
  documents a trained model would write, and `random`, argmax of seeded random logits under
  the mask (a random-weight model), up to 64 tokens a walk;
- `fibermill` is services/worker/engine/grammar_row.py over llguidance: its budget rule
  (a closing kept no longer than the tokens left, 64 a walk) included.

Then what applying a bitmask to CPU logits costs (ms, for 1 and 32 rows): grammar_mask's
numpy unpacking, torch's shifts, and xgrammar's CPU kernel where installed.
"""

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from shared.settings import REPO_ROOT

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "color", "tags"],
    "additionalProperties": False,
}
DOCS = [
    {"name": "Ada Lovelace", "age": 36, "color": "green", "tags": ["math", "engines"]},
    {"name": "Grace", "age": 85, "color": "blue", "tags": []},
    {"name": "A. Turing, who wrote \"On Computable Numbers\"", "age": 41, "color": "red",
     "tags": ["logic", "codes", "morphogenesis"]},
]
WALK = 64


@dataclass
class Tok:
    name: str
    hf: Any
    vocab: int
    eos: int


def tokenizers(qwen: bool, models: Path = REPO_ROOT / "models") -> list[Tok]:
    from transformers import AutoTokenizer

    found = []
    for name in ("tiny-gpt2", "pydoc-gpt2"):
        # pydoc-gpt2 is committed; tiny-gpt2 is built (make models, or a test's model dir)
        folder = models / name if (models / name).exists() else REPO_ROOT / "models" / name
        hf = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        found.append(Tok(name, hf, len(hf), hf.eos_token_id))
    if qwen:
        from benchmarks.qwen_shape import NAME, _tokenizer

        hf = _tokenizer()
        found.append(Tok(NAME, hf, len(hf), hf.eos_token_id))
    return found


class Library:
    """One grammar library as the walks drive it."""

    name = ""

    def setup(self, tok: Tok) -> None:
        raise NotImplementedError

    def compile(self) -> Any:
        raise NotImplementedError

    def start(self, compiled: Any) -> Any:
        raise NotImplementedError

    def fill(self, m: Any, row: torch.Tensor) -> None:
        raise NotImplementedError

    def advance(self, m: Any, token: int) -> None:
        raise NotImplementedError

    def done(self, m: Any) -> bool:
        raise NotImplementedError


class XGrammar(Library):
    name = "xgrammar"

    def setup(self, tok: Tok) -> None:
        import xgrammar

        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tok.hf, vocab_size=tok.vocab,
                                                       stop_token_ids=[tok.eos])
        self.compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)

    def compile(self) -> Any:
        return self.compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)

    def start(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m: Any, row: torch.Tensor) -> None:
        m.fill_next_token_bitmask(row.unsqueeze(0), 0)

    def advance(self, m: Any, token: int) -> None:
        assert m.accept_token(token)

    def done(self, m: Any) -> bool:
        return bool(m.is_terminated())


class LLGuidance(Library):
    name = "llguidance"

    def setup(self, tok: Tok) -> None:
        from services.worker.engine.grammar import GrammarTokenizer

        self.tok = GrammarTokenizer(tok.hf, tok.vocab, [tok.eos])

    def compile(self) -> Any:
        import llguidance

        from shared.grammar_schema import grammar_of

        return llguidance.LLMatcher(self.tok.ll, grammar_of(SCHEMA), log_level=0)

    def start(self, compiled: Any) -> Any:
        return compiled.deep_copy()

    def fill(self, m: Any, row: torch.Tensor) -> None:
        m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)

    def advance(self, m: Any, token: int) -> None:
        assert m.consume_token(token), m.get_error()

    def done(self, m: Any) -> bool:
        return bool(m.is_stopped())


class OutlinesCore(Library):
    name = "outlines-core"

    def setup(self, tok: Tok) -> None:
        import outlines_core

        from shared.grammar_schema import _byte_level_chars

        self.oc = outlines_core
        byte_of = {c: b for b, c in enumerate(_byte_level_chars())}
        vocab: dict[bytes, list[int]] = {}
        for text, i in tok.hf.get_vocab().items():
            if i != tok.eos and all(c in byte_of for c in text):
                vocab.setdefault(bytes(byte_of[c] for c in text), []).append(i)
        self.vocab = outlines_core.Vocabulary(tok.eos, vocab)
        self.eos = tok.eos

    def compile(self) -> Any:
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(SCHEMA), r"[ ]?")
        return self.oc.Index(regex, self.vocab)

    def start(self, compiled: Any) -> Any:
        return self.oc.Guide(compiled)

    def fill(self, m: Any, row: torch.Tensor) -> None:
        m.write_mask_into(row.data_ptr(), row.numel(), 4)

    def advance(self, m: Any, token: int) -> None:
        if token == self.eos and m.is_finished():
            return  # its guide has no state past the end
        m.advance(token, return_tokens=False)

    def done(self, m: Any) -> bool:
        return bool(m.is_finished())


def installed() -> list[Library]:
    import importlib.util

    libs: list[Library] = []
    for lib, module in ((XGrammar(), "xgrammar"), (LLGuidance(), "llguidance"),
                        (OutlinesCore(), "outlines_core")):
        if importlib.util.find_spec(module) is not None:
            libs.append(lib)
        else:
            print(f"{lib.name}: not installed, not measured")
    return libs


@dataclass
class Cost:
    fill_ns: int = 0
    advance_ns: int = 0
    tokens: int = 0

    def per_token(self) -> tuple[float, float]:
        n = max(1, self.tokens)
        return self.fill_ns / n / 1e3, self.advance_ns / n / 1e3


def doc_walks(lib: Library, compiled: Any, tok: Tok, walks: int) -> Cost:
    from services.worker.engine.grammar_mask import new_bitmask

    cost = Cost()
    row = new_bitmask(1, tok.vocab)[0]
    docs = [[*tok.hf.encode(json.dumps(d)), tok.eos] for d in DOCS]
    for w in range(walks):
        m = lib.start(compiled)
        for token in docs[w % len(docs)]:
            t0 = time.perf_counter_ns()
            lib.fill(m, row)
            t1 = time.perf_counter_ns()
            lib.advance(m, token)
            t2 = time.perf_counter_ns()
            cost.fill_ns += t1 - t0
            cost.advance_ns += t2 - t1
            cost.tokens += 1
    return cost


def random_walks(lib: Library, compiled: Any, tok: Tok, walks: int) -> Cost:
    from services.worker.engine.grammar_mask import apply_masks, new_bitmask

    cost = Cost()
    bitmask = new_bitmask(1, tok.vocab)
    for w in range(walks):
        gen = torch.Generator().manual_seed(w)
        m = lib.start(compiled)
        for _ in range(WALK):
            t0 = time.perf_counter_ns()
            lib.fill(m, bitmask[0])
            t1 = time.perf_counter_ns()
            logits = torch.randn(1, tok.vocab, generator=gen)
            apply_masks(logits, bitmask)
            token = int(logits.argmax())
            t2 = time.perf_counter_ns()
            lib.advance(m, token)
            t3 = time.perf_counter_ns()
            cost.fill_ns += t1 - t0
            cost.advance_ns += t3 - t2
            cost.tokens += 1
            if lib.done(m):
                break
    return cost


def fibermill_walks(tok: Tok, walks: int, docs: bool) -> tuple[Cost, float]:
    """The row matcher's fill and accept, budget rule included; and the compile (ms) of a new
    schema through its cache."""
    from services.worker.engine.grammar import GrammarCache
    from services.worker.engine.grammar_mask import apply_masks, new_bitmask
    from services.worker.engine.grammar_row import RowMatcher

    cache = GrammarCache(tok.hf, tok.vocab, [tok.eos])
    t0 = time.perf_counter()
    grammar = cache.get(SCHEMA)
    compile_ms = (time.perf_counter() - t0) * 1e3
    cost = Cost()
    bitmask = new_bitmask(1, tok.vocab)
    doc_tokens = [[*tok.hf.encode(json.dumps(d)), tok.eos] for d in DOCS]
    for w in range(walks):
        gen = torch.Generator().manual_seed(w)
        todo = list(doc_tokens[w % len(doc_tokens)]) if docs else []
        row = RowMatcher(grammar, len(todo) if docs else WALK)
        for _ in range(len(todo) if docs else WALK):
            t0 = time.perf_counter_ns()
            row.fill_mask(bitmask[0])
            t1 = time.perf_counter_ns()
            if docs:
                token = todo.pop(0)
            else:
                logits = torch.randn(1, tok.vocab, generator=gen)
                apply_masks(logits, bitmask)
                token = int(logits.argmax())
            t2 = time.perf_counter_ns()
            row.accept(token)
            t3 = time.perf_counter_ns()
            cost.fill_ns += t1 - t0
            cost.advance_ns += t3 - t2
            cost.tokens += 1
            if row.is_terminated():
                break
    return cost, compile_ms


def timed(f: Callable[[], Any], n: int) -> tuple[float, Any]:
    """Median seconds of `n` calls of `f`, and its last result."""
    times, out = [], None
    for _ in range(n):
        t0 = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def apply_costs(vocab: int, rows: int) -> dict[str, float]:
    """ms to mask `rows` rows of CPU logits, median of 20."""
    import importlib.util

    from services.worker.engine.grammar_mask import new_bitmask, shifted, unpacked

    gen = torch.Generator().manual_seed(0)
    bitmask = new_bitmask(rows, vocab)
    bitmask.copy_(torch.randint(-(2**31), 2**31 - 1, bitmask.shape, generator=gen,
                                dtype=torch.int32))
    logits = torch.randn(rows, vocab, generator=gen)
    ways: dict[str, Callable[[], None]] = {
        "numpy unpack": lambda: unpacked(logits, bitmask),
        "torch shifts": lambda: shifted(logits, bitmask),
    }
    if importlib.util.find_spec("xgrammar") is not None:
        import xgrammar

        ways["xgrammar cpu"] = lambda: xgrammar.apply_token_bitmask_inplace(
            logits, bitmask, vocab_size=vocab)
    return {name: timed(f, 20)[0] * 1e3 for name, f in ways.items()}


def best(rows: list[tuple[float, ...]]) -> tuple[float, ...]:
    """Each column's least value over the rounds: what the code costs when nothing else on the
    machine gets in its way (a shared two-core machine adds its neighbours' work to any one
    round)."""
    return tuple(min(col) for col in zip(*rows, strict=True))


def measure(lib: Library, tok: Tok, walks: int) -> tuple[float, ...]:
    compile_s, compiled = timed(lib.compile, 3)
    fd, ad = doc_walks(lib, compiled, tok, walks).per_token()
    fr, ar = random_walks(lib, compiled, tok, walks).per_token()
    return compile_s * 1e3, fd, ad, fr, ar


def measure_fibermill(tok: Tok, walks: int) -> tuple[float, ...]:
    doc_cost, compile_ms = fibermill_walks(tok, walks, docs=True)
    rnd_cost, _ = fibermill_walks(tok, walks, docs=False)
    return (compile_ms, *doc_cost.per_token(), *rnd_cost.per_token())


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.grammar_cost", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--walks", type=int, default=20, help="walks of each kind (default 20)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of everything; each figure is its best round (default 3)")
    ap.add_argument("--no-qwen", action="store_true", help="leave out the 151,936 vocabulary")
    ap.add_argument("--models-dir", type=Path, default=REPO_ROOT / "models",
                    help="where the models' tokenizers are (default: models/)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # as the stack's worker runs (OMP_NUM_THREADS=1)
    libs = installed()
    head = (f"{'library':<14} {'tokenizer':<20} {'vocab':>7} {'setup s':>8} {'compile ms':>10} "
            f"{'fill doc':>9} {'adv doc':>8} {'fill rnd':>9} {'adv rnd':>8}")
    lines = [head, "-" * len(head)]
    toks = tokenizers(not args.no_qwen, args.models_dir)
    for tok in toks:
        setup: dict[str, float] = {}
        for lib in libs:
            t0 = time.perf_counter()
            lib.setup(tok)
            setup[lib.name] = time.perf_counter() - t0
        rounds: dict[str, list[tuple[float, ...]]] = {}
        for _ in range(args.rounds):  # interleaved, so a busy spell slows every library
            for lib in libs:
                rounds.setdefault(lib.name, []).append(measure(lib, tok, args.walks))
            rounds.setdefault("fibermill", []).append(measure_fibermill(tok, args.walks))
        for name, got in rounds.items():
            c, fd, ad, fr, ar = best(got)
            took = f"{setup[name]:>8.2f}" if name in setup else f"{'':>8}"
            lines.append(f"{name:<14} {tok.name:<20} {tok.vocab:>7} {took} {c:>10.2f} "
                         f"{fd:>9.1f} {ad:>8.1f} {fr:>9.1f} {ar:>8.1f}")
            print(lines[-1], flush=True)
    print("\n" + "\n".join(lines))
    print("\nfill, adv: us a token; fibermill: llguidance through grammar_row.RowMatcher "
          "(budget rule included), its compile through GrammarCache (schema check included)")
    print("\napplying a bitmask to CPU logits, ms (median of 20):")
    for tok in toks:
        for rows in (1, 32):
            costs = apply_costs(tok.vocab, rows)
            print(f"  vocab {tok.vocab:>7}, {rows:>2} rows: "
                  + ", ".join(f"{k} {v:.3f}" for k, v in costs.items()))


if __name__ == "__main__":
    main()
