"""The operators of the causal-LM text graph, and the per-batch state that flows between them.

    START -> tokenize (cpu) -> prefill (device) -> [decode (device)] -> to_host (device)
          -> SPLIT each item: detokenize (cpu) -> JOIN -> collect -> END

Shapes are static for a batch's life: the batch is padded up to its capacity bucket with rows
that clone a real prompt (greedy, budget 0: they never draw from a real item's generator and
their tokens are dropped), and rows never leave the batch. A finished row keeps computing; the
tokens it makes after its end are ignored by `detokenize`, which replays each item's tokens
through the same EOS / stop-string / budget logic the old step-by-step loop applied, so results
are unchanged. The device loop tracks only what it can (EOS ids and budgets) to exit early;
stop strings are found on the host, after the one copy of the token matrix.
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from services.worker.engine import sync
from services.worker.engine.batch import Batch
from services.worker.engine.buffers import BufferSet, capacity
from services.worker.engine.operator import Operator
from services.worker.pipelines.base import TextResult
from shared.messages import FinishReason, TextItem

if TYPE_CHECKING:
    from services.worker.pipelines.text import CausalLMTextPipeline

# The early-exit poll: every this many decode steps the host reads one flag (all rows done).
POLL_EVERY = 8

# Rows of the per-item sampling parameters (buffer "params", shape (N_PARAMS, capacity)).
TEMPERATURE, TOP_K, TOP_P, SAMPLED, BUDGET = range(5)
N_PARAMS = 5


class Uploads:
    """Whether host staging buffers of a set may still be read by queued device copies."""

    def __init__(self) -> None:
        self.pending = False


@dataclass
class Row:
    """One real item of the batch: its prompt ids and token budget."""

    item: TextItem
    prompt: list[int]
    budget: int


@dataclass
class TextBatch:
    """Everything one batch owns between operators (the pipeline itself stays read-only)."""

    rows: list[Row]
    width: int  # padded prompt width
    capacity: int  # batch rows on the device (>= len(rows))
    buffers: BufferSet
    sampled: bool  # any row samples (else argmax only)
    steps: int = 0  # tokens generated per row so far (columns filled in "tokens")
    stopped_at: list[int | None] = field(default_factory=list)
    # Device state, set by prefill.
    next_ids: torch.Tensor | None = None  # (capacity,)
    positions: torch.Tensor | None = None  # (capacity, 1): position of next_ids
    finished: torch.Tensor | None = None  # (capacity,) bool: EOS or budget reached, or stopped
    eos: torch.Tensor | None = None

    @property
    def max_budget(self) -> int:
        return max(row.budget for row in self.rows)

    def note_stops(self, batch: Batch, step: int) -> None:
        """Remember when items stopped (their tokens end there) and finish their rows."""
        for i, stopped in enumerate(batch.stopped):
            if stopped and self.stopped_at[i] is None:
                self.stopped_at[i] = step
                if self.finished is not None:
                    self.finished[i] = True


@dataclass
class ItemTokens:
    """One item's generated tokens as copied to the host (possibly past its end)."""

    item: TextItem
    budget: int
    tokens: list[int]
    stopped_at: int | None  # tokens made before the item was asked to stop, if it was


class _TextOperator(Operator):
    def __init__(self, pipeline: "CausalLMTextPipeline") -> None:
        self.pipeline = pipeline


class Tokenize(_TextOperator):
    """Token ids, budgets and left padding; leases the buffer set and fills its host side."""

    name = "tokenize"
    input_type = list
    output_type = TextBatch
    executor = "cpu"

    def run(self, items: list[TextItem], batch: Batch) -> TextBatch:
        p = self.pipeline
        rows = [p.start(item) for item in items]
        width = max(len(row.prompt) for row in rows)
        cap = capacity(len(rows))
        need = width + max(row.budget for row in rows)
        buffers = batch.hold(p.pool.lease((cap, p.cache_len(cap, need))))
        p.drain(buffers)
        state = TextBatch(
            rows=rows,
            width=width,
            capacity=cap,
            buffers=buffers,
            sampled=any(row.item.temperature > 0 for row in rows),
            stopped_at=[None] * len(rows),
        )
        self._stage(state)
        return state

    def _stage(self, state: TextBatch) -> None:
        """Write prompts, mask, sampling parameters and uniforms into the host buffers."""
        b, width, rows = state.buffers, state.width, state.rows
        ids, mask, params = b["ids_host"], b["mask_host"], b["params_host"]
        pad = self.pipeline.pad_id
        for r in range(state.capacity):
            prompt = rows[r if r < len(rows) else 0].prompt
            start = width - len(prompt)
            ids[r].fill_(pad)
            ids[r, start:width] = torch.tensor(prompt, dtype=ids.dtype)
            # Ones from the first real token on, future slots included: the causal mask keeps
            # a query from seeing past itself, so this equals a mask that grows by one a step.
            mask[r].zero_()
            mask[r, start:] = 1
        inf = float("inf")
        values = [[1.0, inf, inf, 0.0, 0.0] for _ in range(state.capacity)]  # pad rows
        for r, row in enumerate(rows):
            it = row.item
            values[r] = [
                it.temperature if it.temperature > 0 else 1.0,
                float(it.top_k) if it.top_k > 0 else inf,
                # top_p == 1 skips the nucleus filter, so rounding never trims the tail.
                it.top_p if it.top_p < 1 else inf,
                1.0 if it.temperature > 0 else 0.0,
                float(row.budget),
            ]
        params.copy_(torch.tensor(values, dtype=params.dtype).T)
        if state.sampled:
            uniforms = b["uniforms_host"]
            for r, row in enumerate(rows):
                if row.item.temperature > 0:
                    # One uniform per step from the item's own CPU generator, drawn one at a
                    # time as the step-by-step loop did: the same stream alone or batched.
                    g = torch.Generator(device="cpu").manual_seed(row.item.seed)
                    draws = [torch.rand(1, generator=g) for _ in range(row.budget)]
                    uniforms[: row.budget, r] = torch.cat(draws)


def _forward(p, input_ids, mask, positions, cache):
    """One KV-cached forward that keeps only the last position's logits."""
    return p.model(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=positions,
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )


class Prefill(_TextOperator):
    """Upload the staged inputs, run the prompt through the model, pick the first tokens."""

    name = "prefill"
    input_type = TextBatch
    output_type = TextBatch
    executor = "device"

    def run(self, state: TextBatch, batch: Batch) -> TextBatch:
        p = self.pipeline
        b = state.buffers
        with torch.inference_mode():
            batch.check_stops()
            names = ["ids", "mask", "params"] + (["uniforms"] if state.sampled else [])
            non_blocking = p.device.type == "cuda"
            for name in names:
                b[name].copy_(b[f"{name}_host"], non_blocking=non_blocking)
            b["uploads"].pending = True
            cache = b["cache"]
            cache.reset()
            mask = b["mask"]
            # Positions count real tokens only, so a left-padded row sees the positions its
            # prompt alone would; pads get 0, they are masked out anyway.
            positions = (mask[:, : state.width].cumsum(-1) - 1).clamp_(min=0)
            out = _forward(p, b["ids"][:, : state.width].contiguous(), mask, positions, cache)
            state.eos = p.eos_tensor()
            state.finished = torch.zeros(state.capacity, dtype=torch.bool, device=p.device)
            state.note_stops(batch, 0)  # items already asked to stop
            state.positions = positions[:, -1:]
            _advance(state, out.logits, step=0, pipeline=p)
        return state


class Decode(_TextOperator):
    """The decode loop: one batched, KV-cached forward per step; polls for an early exit."""

    name = "decode"
    input_type = TextBatch
    output_type = TextBatch
    executor = "device"

    def can_operate(self, state: TextBatch, batch: Batch) -> bool:
        return state.max_budget > 1

    def run(self, state: TextBatch, batch: Batch) -> TextBatch:
        p = self.pipeline
        b = state.buffers
        last = state.max_budget - 1
        with torch.inference_mode():
            for step in range(1, last + 1):
                batch.check_stops()
                state.note_stops(batch, step)
                out = _forward(p, state.next_ids[:, None], b["mask"], state.positions, b["cache"])
                _advance(state, out.logits, step=step, pipeline=p)
                if (
                    step % POLL_EVERY == 0
                    and step < last
                    and sync.read_flag(state.finished.all(), p.spec.name, "poll")
                ):
                    break
        return state


class ToHost(_TextOperator):
    """The batch's one device->host copy: the generated token matrix."""

    name = "to_host"
    input_type = TextBatch
    output_type = list
    executor = "device"

    def run(self, state: TextBatch, batch: Batch) -> list[ItemTokens]:
        b = state.buffers
        n = state.steps
        # (steps, capacity) slices of both buffers are contiguous, so the copy is one DMA.
        host = sync.to_host(b["tokens"][:n], b["tokens_host"][:n], self.pipeline.spec.name)
        b["uploads"].pending = False  # the stream has drained, uploads included
        columns = host.numpy()
        return [
            ItemTokens(
                item=row.item,
                budget=row.budget,
                tokens=[int(t) for t in columns[:, i]],
                stopped_at=state.stopped_at[i],
            )
            for i, row in enumerate(state.rows)
        ]


class Detokenize(_TextOperator):
    """Replay one item's tokens through the EOS / stop-string / budget rules: its result."""

    name = "detokenize"
    input_type = ItemTokens
    output_type = TextResult
    executor = "cpu"

    def run(self, value: ItemTokens, batch: Batch) -> TextResult:
        seq = Sequence(item=value.item, budget=value.budget)
        limit = len(value.tokens) if value.stopped_at is None else value.stopped_at
        for token in value.tokens[:limit]:
            if seq.push(token, self.pipeline):
                return seq.result()
        if value.stopped_at is None:
            raise RuntimeError("the decode loop ended before this item finished")
        # Asked to stop before it finished: what it had so far.
        return TextResult(
            text=self.pipeline.decode(seq.generated), finish_reason=FinishReason.CANCELED,
            tokens=seq.tokens,
        )


class Collect(_TextOperator):
    """The joined results, in item order."""

    name = "collect"
    input_type = list
    output_type = list
    executor = "cpu"

    def run(self, value: list[TextResult], batch: Batch) -> list[TextResult]:
        if len(value) != len(batch.items):
            raise RuntimeError(f"{len(value)} results for {len(batch.items)} items")
        return value


def _advance(
    state: TextBatch, logits: torch.Tensor, step: int, pipeline: "CausalLMTextPipeline"
) -> None:
    """Pick the tokens of `step` from the last logits and move every row on by one."""
    b = state.buffers
    params = b["params"]
    next_ids = _pick(logits[:, -1, :].float(), params, b["uniforms"][step], state.sampled)
    b["tokens"][step] = next_ids
    done = (next_ids[:, None] == state.eos[None, :]).any(-1) | (params[BUDGET] <= step + 1)
    state.finished |= done
    state.next_ids = next_ids
    positions = state.positions + 1
    if pipeline.max_positions is not None:
        # Only rows already past their budget get here; their tokens are dropped anyway.
        positions.clamp_(max=pipeline.max_positions - 1)
    state.positions = positions
    state.steps = step + 1


def _pick(
    logits: torch.Tensor, params: torch.Tensor, uniform: torch.Tensor, sampled: bool
) -> torch.Tensor:
    """The next token of every row: argmax for greedy rows, a seeded draw for the others.

    Every operation is row-wise, so a row's token never depends on the rows beside it.
    """
    greedy = logits.argmax(dim=-1)
    if not sampled:
        return greedy
    vocab = logits.shape[-1]
    scaled = logits / params[TEMPERATURE][:, None]
    # Stable sort keeps ties in id order, so a row's draw never depends on its neighbours.
    sorted_logits, order = scaled.sort(dim=-1, descending=True, stable=True)
    ranks = torch.arange(vocab, device=logits.device)
    sorted_logits = sorted_logits.masked_fill(ranks >= params[TOP_K][:, None], float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    # Nucleus: keep a token while the mass ranked above it is still below top_p (the first
    # token always stays).
    probs = probs.masked_fill(probs.cumsum(dim=-1) - probs >= params[TOP_P][:, None], 0.0)
    cdf = probs.cumsum(dim=-1)
    target = uniform * cdf[:, -1]
    position = torch.searchsorted(cdf, target[:, None], right=True).clamp_(max=vocab - 1)
    drawn = order.gather(-1, position)[:, 0]
    return torch.where(params[SAMPLED] > 0, drawn, greedy)


@dataclass
class Sequence:
    """One item's tokens, pushed one at a time: where it ends, and why."""

    item: TextItem
    budget: int
    generated: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None

    @property
    def tokens(self) -> int:
        return len(self.generated)

    def push(self, token: int, pipeline: "CausalLMTextPipeline") -> bool:
        """Record a generated token; True when the item is finished."""
        self.generated.append(token)
        if token in pipeline.eos_ids:
            return self._finish(FinishReason.STOP, pipeline.decode(self.generated[:-1]))
        text = None
        if self.item.stop:
            # Decode the whole continuation: a stop string may span tokens, and a token may
            # complete a multi-byte character that only then matches.
            text = pipeline.decode(self.generated)
            cut = min((i for s in self.item.stop if (i := text.find(s)) >= 0), default=-1)
            if cut >= 0:
                return self._finish(FinishReason.STOP, text[:cut])
        if self.tokens >= self.budget:
            if text is None:
                text = pipeline.decode(self.generated)
            return self._finish(FinishReason.LENGTH, text)
        return False

    def _finish(self, reason: FinishReason, text: str) -> bool:
        self.finish_reason = reason
        self.text = text
        return True

    def result(self) -> TextResult:
        assert self.finish_reason is not None, "only a finished sequence has a result"
        return TextResult(text=self.text, finish_reason=self.finish_reason, tokens=self.tokens)
