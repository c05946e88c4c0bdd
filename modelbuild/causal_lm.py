"""Saving a causal language model built from a config with seeded random weights, the way a
checkpoint is laid out: weights, tokenizer and a generation config that ends at EOS."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, PretrainedConfig, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase


def save_seeded(make: Callable[[Any], PreTrainedModel], config: PretrainedConfig,
                tokenizer: PreTrainedTokenizerBase, out_dir: Path, seed: int = 0) -> None:
    """`make(config)` under `seed`, saved to `out_dir` with `tokenizer`."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    # A private RNG state: the weights depend only on the seed, and the caller's RNG is
    # untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = make(config).eval()
    model.generation_config = GenerationConfig(bos_token_id=eos, eos_token_id=eos,
                                               pad_token_id=pad)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
