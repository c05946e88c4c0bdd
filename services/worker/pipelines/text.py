"""Causal language models, for continuous batching: the engine's decoder (engine/decoder.py)
runs rows that join and leave the running batch at step boundaries, in a fixed pool of KV-cache
slots (engine/text_cache.py).

Every item keeps its own generator, budget and stop strings, so its tokens are the same whether
it runs alone or beside others. This module loads the model and tokenizer, turns an item into
prompt ids and a budget, and runs the model's forward the way the decoder needs it: with a
prepared 4-D mask, so the model's own mask code reads nothing from the device. It is the
decoder's `StepModel` (engine/model_code.py).
"""

import threading
from typing import cast

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from services.worker.engine.model_code import StepCode
from services.worker.engine.text_cache import Shape, SlotCache
from services.worker.engine.text_rows import Row
from services.worker.pipelines.base import Pipeline
from services.worker.pipelines.text_gpt2 import GPT2Forward, fits
from shared.messages import TextItem

# Cache columns per slot when the model does not say how many positions it has.
DEFAULT_CACHE_LEN = 2048


class CausalLMTextPipeline(Pipeline):
    """Registry kind `causal-lm`: greedy or seeded sampling with per-item stops and budgets."""

    def load(self) -> None:
        path = self.spec.path
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        # Prompts are padded by hand, but anyone batching with this tokenizer must pad left too.
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=self.dtype)
        self.tokenizer = tokenizer
        self.pad_id: int = tokenizer.pad_token_id
        # transformers wraps `to` in a decorator whose stub takes the model as its first
        # argument, so a bound call looks wrong to the checker.
        self.model = model.to(self.device).eval()  # type: ignore[arg-type]
        self.lean = GPT2Forward(self.model) if fits(self.model) else None
        self.eos_ids = _eos_ids(tokenizer, model)
        self.max_positions: int | None = getattr(model.config, "max_position_embeddings", None)
        # A slot holds the longest sequence the model can take, so every row fits.
        self.cache_len = self.max_positions or DEFAULT_CACHE_LEN
        # Tokenizing may touch the tokenizer's settings; callers on two threads must not mix.
        self._encode_lock = threading.Lock()

    def prepare(self) -> None:
        """Nothing: the KV-cache slots belong to the decoder that runs the model, which
        allocates them once (`slot_cache`)."""

    def model_code(self) -> StepCode:
        return StepCode(self)

    def slot_cache(self, slots: int) -> SlotCache:
        text = self.model.config.get_text_config(decoder=True)
        heads = text.num_attention_heads
        shape = Shape(
            layers=text.num_hidden_layers,
            kv_heads=getattr(text, "num_key_value_heads", None) or heads,
            head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        )
        return SlotCache(shape, slots, self.cache_len, self.dtype, self.device)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                cache: SlotCache) -> torch.Tensor:
        """One KV-cached forward; the last position's logits, (rows, vocab). `mask` is
        (rows, 1, queries, keys), True where a query may attend. It reaches the model as an
        additive float mask, built once for all layers: PyTorch's CPU attention is an order of
        magnitude slower with a boolean mask (measured: 1.6 ms against 0.07 ms a call for 32
        rows over 70 keys), and eager attention can only add one. A GPT-2 runs through
        `GPT2Forward` (text_gpt2.py), the same ops without the library's per-call
        work."""
        mask = torch.zeros(mask.shape, dtype=self.dtype, device=mask.device).masked_fill_(
            ~mask, torch.finfo(self.dtype).min)
        if self.lean is not None:
            return self.lean(ids, mask, positions, cache)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                         cache=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :]

    def start(self, item: TextItem) -> Row:
        """An item's prompt ids and budget."""
        with self._encode_lock:
            ids = self.tokenizer(item.prompt)["input_ids"]
        if not ids:
            # The model needs at least one token to predict from.
            bos = self.tokenizer.bos_token_id
            ids = [self.tokenizer.eos_token_id if bos is None else bos]
        # Keep the most recent context and stop at the model's position limit.
        ids = ids[-(self.cache_len - 1):]
        budget = min(item.max_new_tokens, self.cache_len - len(ids))
        return Row(item=item, prompt=ids, budget=budget)

    def decode(self, ids: list[int]) -> str:
        # One sequence of ids decodes to one string (a batch of them, to a list).
        return cast(str, self.tokenizer.decode(ids, skip_special_tokens=True))


def _eos_ids(tokenizer, model) -> frozenset[int]:
    """Every id that ends a sequence, from the tokenizer and the generation config."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids.update(configured if isinstance(configured, list) else [configured])
    return frozenset(i for i in ids if i is not None)
