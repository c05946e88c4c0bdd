"""Causal language models, for continuous batching: the engine's decoder (engine/decoder.py)
runs rows that join and leave the running batch at step boundaries, their keys and values in
pages of one KV-cache pool sized by a memory budget (engine/text_cache.py).

Every item keeps its own generator, budget and stop strings, so its tokens are the same whether
it runs alone or beside others. This module loads the model and tokenizer, turns an item into
prompt ids and a budget, and runs the model's forward the way the decoder needs it: with a
prepared 4-D mask, so the model's own mask code reads nothing from the device. It is the
decoder's `StepModel` (engine/model_code.py).
"""

import threading
from typing import cast

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PretrainedConfig

from services.worker.engine.grammar import Grammar, GrammarCache
from services.worker.engine.kv_budget import Budget, budget_bytes
from services.worker.engine.model_code import StepCode
from services.worker.engine.text_cache import PagedCache, Shape, Sizing
from services.worker.engine.text_rows import Row
from services.worker.pipelines.base import Pipeline
from services.worker.pipelines.text_gpt2 import GPT2Forward, fits
from services.worker.pipelines.text_masks import layer_masks
from services.worker.pipelines.token_bytes import TokenSpeller
from shared.errors import ContextLengthExceeded
from shared.messages import ResponseFormat, TextItem
from shared.model_files import context_length
from shared.settings import get_settings

# Tokens a row may hold when the model does not say how many positions it has.
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
        # The context the API measures prompts against (shared/model_files.py reads the same
        # config), so both refuse the same prompts.
        # It is also the most tokens a row holds in the KV cache, whose pool holds one such
        # row at least.
        self.context: int = context_length(self.spec) or self.max_positions or DEFAULT_CACHE_LEN
        # Tokenizing may touch the tokenizer's settings; callers on two threads must not mix.
        self._encode_lock = threading.Lock()
        self._speller = TokenSpeller(tokenizer)
        self._grammars: GrammarCache | None = None  # made for the first structured item

    def prepare(self) -> None:
        """Nothing: the KV cache belongs to the decoder that runs the model, which allocates
        it once (`kv_cache`)."""

    def model_code(self) -> StepCode:
        return StepCode(self)

    def kv_cache(self, rows: int) -> PagedCache:
        """Sized once the weights are loaded: on a GPU the budget is a share of what they
        left free (engine/kv_budget.py)."""
        text = self.model.config.get_text_config(decoder=True)
        heads = text.num_attention_heads
        shape = Shape(
            layers=text.num_hidden_layers,
            kv_heads=getattr(text, "num_key_value_heads", None) or heads,
            head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        )
        settings = get_settings()
        budget = Budget(self.spec.kv_cache_bytes, settings.kv_cache_bytes,
                        settings.gpu_memory_utilization)
        sizing = Sizing(rows=rows, context=self.context,
                        budget=budget_bytes(budget, self.device))
        return PagedCache(shape, sizing, self.dtype, self.device, self.spec.name)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                cache: PagedCache) -> torch.Tensor:
        """One KV-cached forward; the last position's logits, (rows, vocab). `mask` is
        (rows, 1, queries, keys), True where a query may attend. It reaches the model as an
        additive float mask, built once for all layers: PyTorch's CPU attention is an order of
        magnitude slower with a boolean mask (measured: 1.6 ms against 0.07 ms a call for 32
        rows over 70 keys), and eager attention can only add one. A GPT-2 runs through
        `GPT2Forward` (text_gpt2.py), the same ops without the library's per-call
        work."""
        if self.lean is not None:
            return self.lean(ids, self._additive(mask), positions, cache)
        masks = layer_masks(self.text_config, mask, positions)
        additive = ({kind: self._additive(m) for kind, m in masks.items()}
                    if isinstance(masks, dict) else self._additive(masks))
        out = self.model(input_ids=ids, attention_mask=additive, position_ids=positions,
                         cache=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :]

    @property
    def text_config(self) -> PretrainedConfig:
        return self.model.config.get_text_config(decoder=True)

    def _additive(self, mask: torch.Tensor) -> torch.Tensor:
        return torch.zeros(mask.shape, dtype=self.dtype, device=mask.device).masked_fill_(
            ~mask, torch.finfo(self.dtype).min)

    def start(self, item: TextItem) -> Row:
        """An item's prompt ids and budget."""
        with self._encode_lock:
            ids = self.tokenizer(item.prompt)["input_ids"]
        if not ids:
            # The model needs at least one token to predict from.
            bos = self.tokenizer.bos_token_id
            ids = [self.tokenizer.eos_token_id if bos is None else bos]
        # Refused, never cut: the API measured it already, so only a job that bypassed it
        # (or a registry changed since) gets here.
        if len(ids) + item.max_new_tokens > self.context:
            raise ContextLengthExceeded("input.prompts", self.spec.name, self.context, len(ids),
                                        item.max_new_tokens)
        return Row(item=item, prompt=ids, budget=item.max_new_tokens)

    def decode(self, ids: list[int]) -> str:
        # One sequence of ids decodes to one string (a batch of them, to a list).
        return cast(str, self.tokenizer.decode(ids, skip_special_tokens=True))

    def grammar(self, fmt: ResponseFormat) -> Grammar:
        """The grammar an item's `response_format` is decoded under, compiled once per
        schema. Raises InvalidInput for a schema it cannot decode."""
        with self._encode_lock:
            if self._grammars is None:
                width = self.model.get_output_embeddings().weight.shape[0]
                self._grammars = GrammarCache(self.tokenizer, width, self.eos_ids)
        return self._grammars.get(fmt.json_schema if fmt.type == "json_schema" else None)

    def spell(self, token: int) -> tuple[str, bytes]:
        """One token's text alone, and its bytes."""
        with self._encode_lock:
            return self._speller.of(token)


def _eos_ids(tokenizer, model) -> frozenset[int]:
    """Every id that ends a sequence, from the tokenizer and the generation config."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids.update(configured if isinstance(configured, list) else [configured])
    return frozenset(i for i in ids if i is not None)
