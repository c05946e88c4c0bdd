"""A GPT-2 of 6 layers x 256 wide with seeded random weights, built at bench time.

Big enough that the model, not the queue path, takes most of a request's time on a CPU (unlike
tiny-gpt2), small enough to build in a second. It uses tiny-gpt2's tokenizer (vocabulary 1000),
and is written with `save_pretrained` (weights, config, generation config, tokenizer) so every
contender loads the same files with `from_pretrained(dir, local_files_only=True)`.
"""

from pathlib import Path

from shared.settings import REPO_ROOT

NAME = "gpt2-6x256"
TOKENIZER_FROM = REPO_ROOT / "models" / "tiny-gpt2"


def build(out: Path, seed: int = 0, tokenizer_from: Path = TOKENIZER_FROM, layers: int = 6,
          width: int = 256, heads: int = 4) -> Path:
    """Write the model and its tokenizer to `out`; the same seed gives the same weights. Other
    `layers`, `width` and `heads` give another GPT-2 shape on the same tokenizer (the GPU
    benchmark's GPT-2 small: 12 x 768, 12 heads)."""
    # Imported here: the benchmark's report and helpers need no torch.
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_from, local_files_only=True)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=1024,
        n_embd=width,
        n_layer=layers,
        n_head=heads,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
