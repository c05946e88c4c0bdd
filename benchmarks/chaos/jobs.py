"""The jobs a chaos run submits, and how an output under faults is judged against the quiet one.

Every job has its seed in the body, so the quiet phase's output for the same body is what the
job must give however many times its sub-requests were killed, re-sent or batched with others.
Texts are sampled (each row draws from its own seeded stream, whatever rows it is batched
with: engine/decoder.py) and must match exactly; images may differ by one level per
pixel channel, the rounding that a different batch size gives on the CPU (the engine's own
batched-equals-alone tests allow the same), and by nothing more.
"""

import io
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import yaml
from PIL import Image

IMAGE_TOLERANCE = 1  # pixel levels; see the module docstring
WORDS = ["The", "river", "a", "quiet", "machine", "under", "light", "seven", "north", "glass"]


def check_models(registry: Path, text_model: str, image_model: str) -> None:
    models = yaml.safe_load(registry.read_text())["models"]
    for name, kind in ((text_model, "causal-lm"), (image_model, "class-ddpm")):
        if name not in models:
            raise SystemExit(f"{registry} has no model {name!r} (it has {', '.join(models)})")
        if models[name].get("kind") != kind:
            raise SystemExit(f"model {name!r} is {models[name].get('kind')}, not {kind}")


def combos(n: int, seed: int, text_model: str, image_model: str, steps: int) -> list[dict]:
    """`n` distinct bodies, half 2-prompt sampled texts, half 2-prompt digit images, each with
    its own seed."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        job_seed = rng.randrange(2**31 - 1)
        if i % 2 == 0:
            prompts = [" ".join(rng.choices(WORDS, k=rng.randint(1, 4))) for _ in range(2)]
            out.append({"task": "text-generation", "model": text_model,
                        "input": {"prompts": prompts, "max_new_tokens": rng.randint(4, 12),
                                  "temperature": 0.9, "top_k": 40, "seed": job_seed}})
        else:
            prompts = [str(rng.randrange(10)) for _ in range(2)]
            out.append({"task": "image-generation", "model": image_model,
                        "input": {"prompts": prompts, "steps": steps, "seed": job_seed}})
    return out


async def read_outputs(job: dict, fetch: Callable[[str], Awaitable[bytes]]) -> list:
    """A succeeded job's outputs: texts, or each image's pixels (fetched from its URL)."""
    if job["task"] == "text-generation":
        return [o["text"] if o else None for o in job["output"]]
    pixels = []
    for out in job["output"]:
        png = await fetch(out["url"])
        pixels.append(np.asarray(Image.open(io.BytesIO(png))).astype(int))
    return pixels


def same_outputs(expected: list, got: list) -> bool:
    if len(expected) != len(got):
        return False
    for want, have in zip(expected, got, strict=True):
        if isinstance(want, np.ndarray):
            if not isinstance(have, np.ndarray) or want.shape != have.shape:
                return False
            if np.abs(want - have).max() > IMAGE_TOLERANCE:
                return False
        elif want != have:
            return False
    return True
