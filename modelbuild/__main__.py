"""Build the registry's models into a models folder.

    python -m modelbuild [--models-dir models] [--force]

The tiny test models are rebuilt in about a second, so they are built when missing (or always,
with --force). The demo models (digits, pydoc-gpt2) take minutes to train and are committed, so
each is trained only when its folder holds no weights.
"""

import argparse
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from modelbuild import digits, pydoc_gpt2, tiny_diffusion, tiny_gpt2

TINY: dict[str, Callable[[Path], None]] = {
    "tiny-sd": tiny_diffusion.build_tiny_sd,
    "tiny-sdxl": tiny_diffusion.build_tiny_sdxl,
    "tiny-gpt2": tiny_gpt2.build,
}


def has_weights(path: Path) -> bool:
    return any(path.rglob("*.safetensors"))


def build_into(target: Path, build: Callable[[Path], None]) -> None:
    # Build beside the target and swap it in at the end, so an interrupted build never leaves
    # a half-written model where workers would load it.
    scratch = target.with_name(target.name + ".tmp")
    shutil.rmtree(scratch, ignore_errors=True)
    build(scratch)
    shutil.rmtree(target, ignore_errors=True)
    scratch.rename(target)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m modelbuild", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--models-dir", type=Path, default=Path("models"))
    parser.add_argument(
        "--force", action="store_true", help="rebuild the tiny models even if present"
    )
    args = parser.parse_args()
    models_dir: Path = args.models_dir
    models_dir.mkdir(parents=True, exist_ok=True)

    for name, build in TINY.items():
        target = models_dir / name
        if has_weights(target) and not args.force:
            print(f"{name}: present, skipped")
            continue
        started = time.monotonic()
        build_into(target, build)
        print(f"{name}: built in {time.monotonic() - started:.1f} s -> {target}")

    target = models_dir / "pydoc-gpt2"
    if has_weights(target):
        print("pydoc-gpt2: weights present, not retrained")
    else:
        text: dict = {}
        build_into(target, lambda out: text.update(pydoc_gpt2.train(out)))
        print(
            f"pydoc-gpt2: trained {text['steps']} steps in {text['seconds']:.0f} s, held-out "
            f"perplexity {math.exp(text['val_loss_after']):.1f} -> {target}"
        )

    target = models_dir / "digits"
    if has_weights(target):
        print("digits: weights present, not retrained")
        return
    stats: dict = {}
    build_into(target, lambda out: stats.update(digits.train(out)))
    print(f"digits: trained {stats['steps']} steps in {stats['seconds']:.0f} s -> {target}")
    started = time.monotonic()
    accuracy = digits.evaluate(target)
    print(f"digits: SVM accuracy {accuracy:.3f} ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
