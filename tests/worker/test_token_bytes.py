"""A token's bytes, from its vocabulary spelling: byte-level BPE, SentencePiece, or its text."""

from pathlib import Path

import torch

from services.worker.pipelines.text import CausalLMTextPipeline
from services.worker.pipelines.token_bytes import token_bytes
from shared.registry import ModelKind, ModelSpec


def test_byte_level_pieces_spell_their_bytes() -> None:
    assert token_bytes("\u0120the", " the") == b" the"  # GPT-2's space
    assert token_bytes("\u00e2\u0122", "\ufffd") == "\u2019".encode()[:2]


def test_sentencepiece_pieces_spell_their_bytes() -> None:
    assert token_bytes("<0xE2>", "\ufffd") == b"\xe2"
    assert token_bytes("\u2581the", " the") == b" the"


def test_the_tokens_of_a_multibyte_character_join_back(model_dir: Path) -> None:
    pipe = CausalLMTextPipeline(ModelSpec(name="tiny-gpt2-bytes", kind=ModelKind.CAUSAL_LM,
                                          path=model_dir / "tiny-gpt2"), torch.device("cpu"))
    pipe.load()
    text = "caf\u00e9 \u2019 \u4e2d"
    ids = pipe.tokenizer(text)["input_ids"]
    assert b"".join(pipe.spell(t)[1] for t in ids) == text.encode()
