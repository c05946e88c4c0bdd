"""benchmarks/grammar_cost.py runs and prints its table (the libraries not installed are
named, not measured)."""

import subprocess
import sys
from pathlib import Path

from shared.settings import REPO_ROOT


def test_the_benchmark_prints_a_row_per_library_and_tokenizer(model_dir: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.grammar_cost", "--walks", "1", "--rounds", "1",
         "--no-qwen", "--models-dir", str(model_dir)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=240, check=True,
    ).stdout
    table = out.split("\n\n")[1].splitlines()
    assert table[0].split()[:3] == ["library", "tokenizer", "vocab"]
    rows = {(line.split()[0], line.split()[1]) for line in table[2:]}
    for tokenizer in ("tiny-gpt2", "pydoc-gpt2"):
        assert ("llguidance", tokenizer) in rows
        assert ("fibermill", tokenizer) in rows
    assert "applying a bitmask to CPU logits" in out
