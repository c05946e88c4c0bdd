"""A GPT-2 language model from a tiny config with random weights: fast, deterministic, for tests.

Its output is gibberish; what it is for is exercising the text path (tokenize, pad, batch,
generate, stop) with a real `GPT2LMHeadModel` in well under a second.
"""

from pathlib import Path

from transformers import GPT2Config, GPT2LMHeadModel

from modelbuild.causal_lm import save_seeded
from modelbuild.tokenizers import train_gpt2_tokenizer

SEED = 0
MAX_POSITIONS = 1024


def build(out_dir: Path) -> None:
    """Write model, tokenizer and generation config to `out_dir` (created if missing)."""
    out_dir = Path(out_dir)
    tokenizer = train_gpt2_tokenizer(model_max_length=MAX_POSITIONS)
    eos = tokenizer.eos_token_id
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=MAX_POSITIONS,
        n_embd=64,
        n_layer=2,
        n_head=2,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
    )
    save_seeded(GPT2LMHeadModel, config, tokenizer, out_dir, SEED)
