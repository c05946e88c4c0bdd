"""The prefix-cache benchmark's inputs and report (no stack runs here)."""

import json
from pathlib import Path

from benchmarks import gpt2_6x256
from benchmarks import prefix_cache as pc


def test_system_prompts_are_distinct_from_their_first_page_and_of_the_set_length(
        tmp_path: Path, model_dir: Path) -> None:
    model_dir = gpt2_6x256.build(tmp_path / "m", tokenizer_from=model_dir / "tiny-gpt2")
    systems = pc.prefixes(model_dir, 3, seed=1)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    ids = [tok(s)["input_ids"] for s in systems]
    assert all(abs(len(i) - pc.PREFIX_TOKENS) <= 4 for i in ids)
    assert len({tuple(i[:16]) for i in ids}) == 3


def test_batch_lines_pair_each_question_with_its_system_prompt(tmp_path: Path) -> None:
    path = pc.batch_file(tmp_path / "in.jsonl", ["A ", "B "], pc.questions(3))
    bodies = [json.loads(line)["body"] for line in path.read_text().splitlines()]
    assert [b["prompt"][:2] for b in bodies] == ["A ", "B ", "A "]
    assert {b["max_tokens"] for b in bodies} == {pc.NEW_TOKENS}


def test_the_report_gives_the_speedup_and_the_first_token_ratio() -> None:
    r = {"lines": 10, "ttft": 2, ("batch", "distinct"): {"seconds": 30.0},
         ("batch", "shared"): {"seconds": 5.0}, ("batch hits", "distinct"): 0.0,
         ("batch hits", "shared"): 0.95, ("ttft", "distinct"): [0.2, 0.1],
         ("ttft", "shared"): [0.04, 0.05]}
    lines = pc.report(r)
    assert "| batch, creation to completed (s) | 30.0 | 5.0 | 6.00x faster |" in lines
    assert "| interactive, p50 time to first token (ms) | 150.0 | 45.0 | 0.30x |" in lines
