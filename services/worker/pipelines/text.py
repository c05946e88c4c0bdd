"""Causal language models as an operator graph: a batch of prompts decoded with a static KV cache.

Every item keeps its own generator, budget and stop strings, so its tokens are the same whether
it runs alone or in a batch. The graph and the per-batch state are in `text_operators.py`; this
module loads the model, wires the graph and sizes the buffer pool.

Buffer sets are keyed `(capacity, L)`: capacity is the batch rounded up to a power of two, L the
KV-cache length, which covers the padded prompt width plus the largest budget. A batch takes the
shortest pooled L that covers it (so short prompts share the pooled sets instead of allocating),
else a power of two of at least 32, capped at the model's position limit.
"""

import threading
from collections.abc import Hashable
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, StaticCache

from services.worker.engine import sync
from services.worker.engine.buffers import BucketKey, BufferSet, capacity
from services.worker.engine.graph import Graph
from services.worker.engine.router import END, JOIN, START, Branch, Router, Split
from services.worker.pipelines.base import Pipeline
from services.worker.pipelines.text_operators import (
    N_PARAMS,
    Collect,
    Decode,
    Detokenize,
    Prefill,
    Row,
    ToHost,
    Tokenize,
    Uploads,
)
from shared.messages import TextItem

MIN_CACHE_LEN = 32
# The pooled cache length is sized for a prompt of this many tokens plus the default budget.
POOLED_PROMPT_TOKENS = 64


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
        self.model = model.to(self.device).eval()
        self.eos_ids = _eos_ids(tokenizer, model)
        self.max_positions: int | None = getattr(model.config, "max_position_embeddings", None)
        # Encoding may touch the tokenizer's settings; CPU operators of two batches can overlap.
        self._encode_lock = threading.Lock()
        self._eos_device: tuple[frozenset[int], torch.Tensor] | None = None
        self.eos_tensor()

    def build_graph(self) -> Graph:
        operators = [op(self) for op in (Tokenize, Prefill, Decode, ToHost, Detokenize, Collect)]
        router = Router(
            {
                START: "tokenize",
                "tokenize": "prefill",
                # Straight to the copy when no item needs more than the prefill's token.
                "prefill": Branch("decode", "to_host"),
                "decode": "to_host",
                "to_host": Split(each="detokenize", then="collect"),
                "detokenize": JOIN,
                "collect": END,
            }
        )
        return Graph(operators, router)

    def allocate(self, key: BucketKey) -> dict[str, Any]:
        cap, length = key
        config = self.model.config
        text = config.get_text_config(decoder=True)
        heads = text.num_attention_heads
        kv_heads = getattr(text, "num_key_value_heads", None) or heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        cache = StaticCache(config=config, max_cache_len=length)
        cache.early_initialization(
            batch_size=cap,
            num_heads=kv_heads,
            head_dim=head_dim,
            dtype=self.dtype,
            device=self.device,
        )
        device, long, f32 = self.device, torch.long, torch.float32
        host_uniforms = sync.pinned((length, cap), f32, device)
        host_uniforms.zero_()
        return {
            "cache": cache,
            # Device side.
            "ids": torch.zeros((cap, length), dtype=long, device=device),
            "mask": torch.zeros((cap, length), dtype=long, device=device),
            "params": torch.zeros((N_PARAMS, cap), dtype=f32, device=device),
            "uniforms": torch.zeros((length, cap), dtype=f32, device=device),
            "tokens": torch.zeros((length, cap), dtype=long, device=device),  # step-major
            # Host staging (pinned on CUDA).
            "ids_host": sync.pinned((cap, length), long, device),
            "mask_host": sync.pinned((cap, length), long, device),
            "params_host": sync.pinned((N_PARAMS, cap), f32, device),
            "uniforms_host": host_uniforms,
            "tokens_host": sync.pinned((length, cap), long, device),
            "uploads": Uploads(),
            "fence": torch.zeros((), dtype=torch.bool, device=device),
        }

    def pool_buckets(self) -> list[BucketKey]:
        length = self._bucket_len(POOLED_PROMPT_TOKENS + self.spec.defaults.max_new_tokens)
        top = capacity(self.spec.max_batch)
        return [(1 << i, length) for i in range(top.bit_length())]

    def batch_key(self, item: TextItem) -> Hashable:
        return "text"  # any text items may share a batch

    def cache_len(self, cap: int, need: int) -> int:
        """The KV-cache length for a batch of capacity `cap` needing `need` slots."""
        pooled = sorted(length for c, length in self.pool.buckets() if c == cap)
        for length in pooled:
            if length >= need:
                return length
        # A mixed batch (a long prompt with a small budget beside a short one with a large
        # budget) can need more than the position limit; it gets exactly what it needs.
        return max(self._bucket_len(need), need)

    def _bucket_len(self, need: int) -> int:
        length = max(MIN_CACHE_LEN, 1 << (need - 1).bit_length())
        if self.max_positions is not None:
            length = min(length, self.max_positions)
        return length

    def start(self, item: TextItem) -> Row:
        """An item's prompt ids and budget."""
        with self._encode_lock:
            ids = self.tokenizer(item.prompt)["input_ids"]
        if not ids:
            # The model needs at least one token to predict from.
            bos = self.tokenizer.bos_token_id
            ids = [self.tokenizer.eos_token_id if bos is None else bos]
        budget = item.max_new_tokens
        if self.max_positions is not None:
            # Keep the most recent context and stop at the model's position limit.
            ids = ids[-(self.max_positions - 1) :]
            budget = min(budget, self.max_positions - len(ids))
        return Row(item=item, prompt=ids, budget=budget)

    def eos_tensor(self) -> torch.Tensor:
        """`eos_ids` on the device (built again only when `eos_ids` changes)."""
        if self._eos_device is None or self._eos_device[0] != self.eos_ids:
            ids = torch.tensor(sorted(self.eos_ids), dtype=torch.long).to(self.device)
            self._eos_device = (self.eos_ids, ids)
        return self._eos_device[1]

    def drain(self, buffers: BufferSet) -> None:
        """Before refilling a set's host staging buffers, let queued copies from them land.

        Only a batch that ended early (stopped, failed) leaves copies that may still be queued;
        every other batch ends with the output sync, which drains the stream.
        """
        uploads = buffers["uploads"]
        if uploads.pending and self.device.type == "cuda":
            sync.read_flag(buffers["fence"], self.spec.name, "reuse")
        uploads.pending = False

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def _eos_ids(tokenizer, model) -> frozenset[int]:
    """Every id that ends a sequence, from the tokenizer and the generation config."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids.update(configured if isinstance(configured, list) else [configured])
    return frozenset(i for i in ids if i is not None)
