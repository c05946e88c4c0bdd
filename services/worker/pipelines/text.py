"""Causal language models: one batched, KV-cached forward per decode step for a batch of prompts.

Every item keeps its own generator, budget and stop strings, so its tokens are the same whether
it runs alone or in a batch.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from services.worker.pipelines.base import Pipeline, ShouldStop, TextResult
from services.worker.pipelines.stopped import PipelineStopped
from shared.subrequest import TextItem


class CausalLMTextPipeline(Pipeline):
    """Registry kind `causal-lm`: greedy or seeded sampling with per-item stops and budgets."""

    def setup(self) -> None:
        path = self.spec.path
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        # run() pads by hand, but anyone batching with this tokenizer must pad on the left too.
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=self.dtype)
        self.tokenizer = tokenizer
        self.model = model.to(self.device).eval()
        self.eos_ids = _eos_ids(tokenizer, model)
        self.max_positions: int | None = getattr(model.config, "max_position_embeddings", None)

    @torch.inference_mode()
    def run(
        self, items: Sequence[TextItem], should_stop: ShouldStop | None = None
    ) -> list[TextResult]:
        if not items:
            return []
        seqs = [self._start(item) for item in items]
        input_ids, attention_mask = self._left_pad([s.prompt_ids for s in seqs])
        # Positions count real tokens only, so a left-padded row sees the same positions as the
        # prompt alone would; pads get 0, they are masked out anyway.
        position_ids = (attention_mask.cumsum(-1) - 1).clamp_(min=0)
        active = list(range(len(seqs)))  # batch row -> index into seqs
        cache = None
        while True:
            if should_stop is not None and should_stop():
                raise PipelineStopped
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            cache = out.cache
            next_ids = _pick(out.logits[:, -1, :].float(), [seqs[i] for i in active])
            # One device->host copy per step, needed for the EOS / stop-string checks; the engine
            # will revisit this (e.g. check stops on device and sync every few steps).
            keep = [
                row
                for row, token in enumerate(next_ids.tolist())
                if not seqs[active[row]].push(token, self)
            ]
            if not keep:
                break
            if len(keep) < len(active):
                # Finished rows leave the batch; rows are independent, so the rest are unchanged.
                rows = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(rows)
                attention_mask = attention_mask[rows]
                position_ids = position_ids[rows]
                next_ids = next_ids[rows]
                active = [active[row] for row in keep]
            ones = attention_mask.new_ones((len(active), 1))
            attention_mask = torch.cat([attention_mask, ones], dim=-1)
            position_ids = position_ids[:, -1:] + 1
            input_ids = next_ids[:, None]
        return [s.result() for s in seqs]

    def _start(self, item: TextItem) -> "_Sequence":
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
        generator = torch.Generator(device="cpu").manual_seed(item.seed)
        return _Sequence(item=item, prompt_ids=ids, budget=budget, generator=generator)

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(ids) for ids in prompts)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in prompts])
        attention_mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in prompts])
        return input_ids.to(self.device), attention_mask.to(self.device)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


@dataclass
class _Sequence:
    """One item's progress through the decode loop."""

    item: TextItem
    prompt_ids: list[int]
    budget: int
    generator: torch.Generator
    generated: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: Literal["stop", "length"] | None = None

    @property
    def tokens(self) -> int:
        return len(self.generated)

    def push(self, token: int, pipeline: CausalLMTextPipeline) -> bool:
        """Record a generated token; True when the item is finished."""
        self.generated.append(token)
        if token in pipeline.eos_ids:
            return self._finish("stop", pipeline.decode(self.generated[:-1]))
        text = None
        if self.item.stop:
            # Decode the whole continuation: a stop string may span tokens, and a token may
            # complete a multi-byte character that only then matches.
            text = pipeline.decode(self.generated)
            cut = min((i for s in self.item.stop if (i := text.find(s)) >= 0), default=-1)
            if cut >= 0:
                return self._finish("stop", text[:cut])
        if self.tokens >= self.budget:
            return self._finish("length", pipeline.decode(self.generated) if text is None else text)
        return False

    def _finish(self, reason: Literal["stop", "length"], text: str) -> bool:
        self.finish_reason = reason
        self.text = text
        return True

    def result(self) -> TextResult:
        assert self.finish_reason is not None, "run() returns only once every item finished"
        return TextResult(text=self.text, finish_reason=self.finish_reason, tokens=self.tokens)


def _eos_ids(tokenizer, model) -> frozenset[int]:
    """Every id that ends a sequence, from the tokenizer and the generation config."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids.update(configured if isinstance(configured, list) else [configured])
    return frozenset(i for i in ids if i is not None)


def _pick(logits: torch.Tensor, seqs: list[_Sequence]) -> torch.Tensor:
    """The next token of every row: argmax for greedy items, a seeded draw for the others."""
    next_ids = logits.argmax(dim=-1)
    sampled = [row for row, s in enumerate(seqs) if s.item.temperature > 0]
    if not sampled:
        return next_ids
    device = logits.device
    vocab = logits.shape[-1]
    items = [seqs[row].item for row in sampled]
    rows = torch.tensor(sampled, device=device)
    temperature = torch.tensor([it.temperature for it in items], device=device)
    scaled = logits[rows] / temperature[:, None]
    # Stable sort keeps ties in id order, so a row's draw never depends on its neighbours.
    sorted_logits, order = scaled.sort(dim=-1, descending=True, stable=True)
    ranks = torch.arange(vocab, device=device)
    top_k = torch.tensor([it.top_k if it.top_k > 0 else vocab for it in items], device=device)
    sorted_logits = sorted_logits.masked_fill(ranks >= top_k[:, None], float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    # Nucleus: keep a token while the mass ranked above it is still below top_p (the first token
    # always stays). top_p == 1 skips the filter so rounding never trims the tail.
    top_p = torch.tensor(
        [it.top_p if it.top_p < 1 else float("inf") for it in items], device=device
    )
    probs = probs.masked_fill(probs.cumsum(dim=-1) - probs >= top_p[:, None], 0.0)
    cdf = probs.cumsum(dim=-1)
    # One uniform per item per step from the item's own CPU generator: the same stream alone or
    # batched, on any device.
    uniform = torch.cat([torch.rand(1, generator=seqs[row].generator) for row in sampled])
    target = uniform.to(device) * cdf[:, -1]
    position = torch.searchsorted(cdf, target[:, None], right=True).clamp_(max=vocab - 1)
    next_ids[rows] = order.gather(-1, position)[:, 0]
    return next_ids
