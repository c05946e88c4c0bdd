"""Plain transformers `generate`, the way the peers run it: one code path for the in-process
baseline and the LitServe server, so the two differ only in what is around the model.

Greedy, left padding, and no EOS (the generation config's `eos_token_id` cleared, which costs
nothing per step, unlike `min_new_tokens`), so every row makes exactly the number of tokens
asked for, as a static batch does.
"""

import copy
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging


def load(model_dir: Path | str, device: str = "cpu"):
    """(model, tokenizer) from a local directory."""
    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # float32 on the CPU whatever the checkpoint's dtype, as Fibermill's `dtype: auto`; on a
    # GPU the checkpoint's own.
    dtype = torch.float32 if device == "cpu" else "auto"
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=dtype)
    # transformers wraps `to` in a decorator whose stub drops the bound self
    return model.to(device).eval(), tokenizer  # type: ignore[arg-type]


def generate(model, tokenizer, prompts: list[str], budgets: list[int]) -> list[tuple[str, int]]:
    """(text, generated tokens) per prompt: one batch, padded on the left, greedy, run to the
    largest budget (static batching); each row keeps only its own budget's tokens."""
    longest = max(budgets)
    enc = tokenizer(prompts, return_tensors="pt", padding=True).to(model.device)
    config = copy.deepcopy(model.generation_config)
    config.update(max_new_tokens=longest, do_sample=False, eos_token_id=None,
                  pad_token_id=tokenizer.pad_token_id)
    with torch.inference_mode():
        out = model.generate(**enc, generation_config=config)
    new = out[:, enc["input_ids"].shape[1] :].cpu()
    return [
        (tokenizer.decode(row[:n], skip_special_tokens=True), int(row[:n].numel()))
        for row, n in zip(new, budgets, strict=True)
    ]
