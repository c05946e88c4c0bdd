"""The pydoc-gpt2 demo model: a small GPT-2 trained on the standard library's own documentation.

Python ships about 1.6 MB of English with itself, in its docstrings and pydoc's help topics,
so this trains offline, on CPU, in about three minutes. It writes like a terse docstring
("Return the ...") and knows nothing else; what it shows is that the text path serves a real
model whose output is more than random tokens. 2% of the text is held out to measure that.

    python -m modelbuild.pydoc_gpt2 --out models/pydoc-gpt2 [--seconds 180]
"""

import argparse
import functools
import inspect
import json
import math
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel, GPT2Tokenizer

from modelbuild.tokenizers import train_gpt2_tokenizer

SEED = 0
CONTEXT = 128
VOCAB_SIZE = 4096
HOLD_OUT = 0.02  # the share of the text kept for validation
PROMPTS = ("Return the", "This module provides", "The default value")


def _collect_docs(out_path: str) -> None:
    """Write the docstrings of the importable standard library, and pydoc's topics, as JSON.

    Runs in a child interpreter (see `corpus`), so this must import all it needs itself.
    """
    import contextlib
    import importlib
    import inspect
    import json
    import pkgutil
    import sys
    import warnings

    # Importing these opens windows or a browser, writes files, or runs the interpreter's own
    # tests; pydoc_data is read directly below, and encodings holds codecs rather than prose.
    skip = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "test"}
    skip |= {"lib2to3", "distutils", "ensurepip", "pydoc_data", "encodings"}

    def wanted(name: str) -> bool:
        parts = name.split(".")
        # Private modules repeat their public wrappers, and __main__ modules run on import.
        return parts[0] not in skip and not any(
            p.startswith("_") or p in ("test", "tests") for p in parts
        )

    docs: dict[str, None] = {}  # ordered and free of repeats

    def add(text) -> None:
        if isinstance(text, str) and text.strip():
            docs.setdefault(inspect.cleandoc(text), None)

    queue = sorted(name for name in sys.stdlib_module_names if wanted(name))
    # Some modules print or warn when imported; none of that is wanted on stdout, which the
    # caller may be reading.
    with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
        warnings.simplefilter("ignore")
        while queue:
            name = queue.pop(0)
            try:
                module = importlib.import_module(name)
            except Exception:
                continue  # another platform's module, or a C library this build lacks
            if hasattr(module, "__path__"):
                subs = sorted(
                    f"{name}.{info.name}" for info in pkgutil.iter_modules(module.__path__)
                )
                queue[:0] = [sub for sub in subs if wanted(sub)]
            add(module.__doc__)
            for attr, value in sorted(vars(module).items()):
                # Only what the module defines: re-exports would repeat another module's docs.
                if attr.startswith("_") or getattr(value, "__module__", None) != name:
                    continue
                if callable(value):
                    add(value.__doc__)
                if inspect.isclass(value):
                    for member, item in sorted(vars(value).items()):
                        if not member.startswith("_"):
                            add(getattr(item, "__doc__", None))
        from pydoc_data.topics import topics

        for key in sorted(topics):
            add(topics[key])
    with open(out_path, "w", encoding="utf-8") as out:
        json.dump(list(docs), out)


@functools.cache
def corpus() -> tuple[str, ...]:
    """All documents, in a fixed order: the same on every run of the same Python installation."""
    # A child interpreter imports the whole standard library, so that its side effects (atexit
    # hooks, signal handlers, readline) stay out of this process.
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "docs.json"
        source = f"{inspect.getsource(_collect_docs)}\n_collect_docs({str(out)!r})\n"
        subprocess.run([sys.executable, "-I", "-c", source], check=True, capture_output=True)
        docs = json.loads(out.read_text(encoding="utf-8"))
    return tuple(dict.fromkeys(unwrap(doc) for doc in docs))


def unwrap(text: str) -> str:
    """Join hard-wrapped prose lines, keeping indented blocks, lists and headings as they are."""
    # Docstrings are wrapped at about 72 columns. A model this small, left to guess where an
    # editor broke lines, learns to emit newlines; on unwrapped text it spends itself on words.
    lines = text.split("\n")
    out = [lines[0]]
    for line in lines[1:]:
        prose = bool(line) and (line[0].isalpha() or line[0] in "\"'`(")
        if prose and out[-1] and not out[-1][0].isspace():
            out[-1] += " " + line
        else:
            out.append(line)
    return "\n".join(out)


def split(texts) -> tuple[list[str], list[str]]:
    """(training, held-out) documents, the held-out ones about 2% of the text."""
    # Documents are drawn in an order fixed by their text, and taken while they fit, so one
    # long help topic cannot make the held-out share several times too large.
    room = HOLD_OUT * sum(map(len, texts))
    held_out = set()
    for text in sorted(texts, key=lambda t: zlib.crc32(t.encode())):
        if len(text) <= room:
            held_out.add(text)
            room -= len(text)
    return [t for t in texts if t not in held_out], [t for t in texts if t in held_out]


def train_tokenizer(texts: list[str]) -> GPT2Tokenizer:
    return train_gpt2_tokenizer(VOCAB_SIZE, CONTEXT, texts)


def token_stream(tokenizer: GPT2Tokenizer, texts: list[str]) -> torch.Tensor:
    """All texts as one sequence of ids, each document preceded by EOS as in GPT-2's training."""
    eos = tokenizer.eos_token_id
    encoded = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    return torch.tensor([i for e in encoded for i in (eos, *e.ids)])


def build_model(tokenizer: GPT2Tokenizer) -> GPT2LMHeadModel:
    eos = tokenizer.eos_token_id
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=CONTEXT,
        n_embd=128,
        n_layer=4,
        n_head=4,
        # Three minutes allow only a few passes over the text, too few to need dropout; it would
        # only slow learning down.
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
    )
    return GPT2LMHeadModel(config)


def next_token_loss(model: GPT2LMHeadModel, windows: torch.Tensor) -> torch.Tensor:
    """Mean loss of predicting each token of `windows` (batch, length) from those before it."""
    logits = model(input_ids=windows, attention_mask=torch.ones_like(windows)).logits
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), windows[:, 1:].flatten())


@torch.no_grad()
def mean_loss(model: GPT2LMHeadModel, stream: torch.Tensor, batch_size: int = 32) -> float:
    """Mean next-token loss over consecutive CONTEXT-long windows of `stream`."""
    model.eval()
    windows = stream[: len(stream) // CONTEXT * CONTEXT].view(-1, CONTEXT)
    total = 0.0
    for start in range(0, len(windows), batch_size):
        batch = windows[start : start + batch_size]
        total += next_token_loss(model, batch).item() * len(batch)
    return total / len(windows)


def train(
    out_dir: Path,
    seconds_budget: float = 180.0,
    steps: int | None = None,
    batch_size: int = 8,
    max_lr: float = 2e-3,
    warmup: int = 30,
) -> dict:
    """Train and save model, tokenizer and generation config to `out_dir`; returns the numbers.

    Without `steps`, training stops after `seconds_budget` and the learning rate follows the
    elapsed share of the budget, so the run ends on time however busy the machine is; with
    `steps` the schedule follows steps and a run is repeatable.
    """
    torch.set_num_threads(2)
    torch.manual_seed(SEED)
    texts, held_out = split(corpus())
    tokenizer = train_tokenizer(texts)
    train_ids, val_ids = token_stream(tokenizer, texts), token_stream(tokenizer, held_out)
    model = build_model(tokenizer)
    loss_before = mean_loss(model, val_ids)

    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, param in model.named_parameters():
        # Weight decay is for matrices; it would only pull biases and norm gains to zero.
        (decay if param.dim() >= 2 and "ln" not in name else no_decay).append(param)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=max_lr,
        betas=(0.9, 0.95),
    )
    generator = torch.Generator().manual_seed(SEED)
    offsets = torch.arange(CONTEXT)
    model.train()
    started = time.monotonic()
    step = 0
    losses: list[float] = []
    while True:
        progress = step / steps if steps else (time.monotonic() - started) / seconds_budget
        if progress >= 1:
            break
        # Warm-up lets Adam's moment estimates settle before full-size steps; the cosine ends at
        # a tenth of the peak, not zero, so the last steps still learn.
        scale = 0.1 + 0.45 * (1 + math.cos(math.pi * progress))
        lr = max_lr * min(1.0, (step + 1) / warmup) * scale
        for group in optimizer.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, len(train_ids) - CONTEXT, (batch_size,), generator=generator)
        window = train_ids[starts[:, None] + offsets]
        loss = next_token_loss(model, window)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        step += 1
    seconds = time.monotonic() - started

    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=model.config.eos_token_id,
        eos_token_id=model.config.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {
        "steps": step,
        "seconds": seconds,
        "train_tokens": len(train_ids),
        "val_tokens": len(val_ids),
        "train_loss": sum(losses[-50:]) / len(losses[-50:]),
        "val_loss_before": loss_before,
        "val_loss_after": mean_loss(model, val_ids),
    }


def samples(model_dir: Path, prompts=PROMPTS, max_new_tokens: int = 24) -> list[str]:
    """Greedy continuations through the service's own text pipeline."""
    # Imported here so that training does not need the worker's pipeline stack.
    from services.worker.engine.engine import Engine
    from services.worker.engine.results import TextResult
    from services.worker.pipelines.text import CausalLMTextPipeline
    from shared.messages import TextItem
    from shared.registry import ModelSpec

    spec = ModelSpec(name="pydoc-gpt2", kind="causal-lm", path=Path(model_dir))
    pipeline = CausalLMTextPipeline(spec, torch.device("cpu"))
    pipeline.setup()
    items = [TextItem(prompt=p, max_new_tokens=max_new_tokens) for p in prompts]
    results = Engine(pipeline).run(items)
    texts = [r.text for r in results if isinstance(r, TextResult)]
    assert len(texts) == len(results), "a text pipeline answered with an image"
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m modelbuild.pydoc_gpt2", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, default=Path("models/pydoc-gpt2"))
    parser.add_argument("--seconds", type=float, default=180.0, help="training time budget")
    parser.add_argument("--steps", type=int, help="train this many steps instead (repeatable)")
    args = parser.parse_args()
    stats = train(args.out, seconds_budget=args.seconds, steps=args.steps)
    print(
        f"trained {stats['steps']} steps in {stats['seconds']:.0f} s on "
        f"{stats['train_tokens']} tokens (last 50 steps' loss {stats['train_loss']:.3f}) "
        f"-> {args.out}"
    )
    for when in ("before", "after"):
        loss = stats[f"val_loss_{when}"]
        print(
            f"held-out loss {when} training: {loss:.3f} (perplexity {math.exp(loss):.1f}, "
            f"{stats['val_tokens']} tokens)"
        )
    for prompt, text in zip(PROMPTS, samples(args.out), strict=True):
        print(f"{prompt!r} -> {text!r}")


if __name__ == "__main__":
    main()
