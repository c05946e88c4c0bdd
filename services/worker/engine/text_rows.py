"""One text item on the host: its prompt ids and budget, and its tokens as they arrive."""

from dataclasses import dataclass, field
from typing import Protocol

from services.worker.engine.results import TextResult
from services.worker.engine.text_stream import holdback, publishable
from shared.messages import FinishReason, TextItem, TokenLogprob, TopLogprob


class Detokenizer(Protocol):
    @property
    def eos_ids(self) -> frozenset[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def spell(self, token: int) -> tuple[str, bytes]: ...


# A token's log-probability and its alternatives' (id, log-probability), most likely first.
Score = tuple[float, list[tuple[int, float]]]


@dataclass
class Row:
    """An item ready to decode: its prompt ids and its token budget."""

    item: TextItem
    prompt: list[int]
    budget: int


@dataclass
class Sequence:
    """One item's tokens, pushed one at a time: where it ends, and why."""

    item: TextItem
    budget: int
    prompt_tokens: int | None = None
    generated: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None
    # Each token's log-probability, when the item asked for them.
    logprobs: list[TokenLogprob] | None = None
    # The continuation decoded at a token count: the stop check and the stream share it.
    _decoded: tuple[int, str] = field(default=(0, ""), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.item.logprobs is not None and self.logprobs is None:
            self.logprobs = []

    @property
    def tokens(self) -> int:
        return len(self.generated)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def push(self, token: int, model: Detokenizer, score: Score | None = None) -> bool:
        """Record a generated token (and its log-probability, if the item asked); True when
        the item is finished."""
        self.generated.append(token)
        if self.logprobs is not None and score is not None:
            self.logprobs.append(_entry(model, token, score))
        if token in model.eos_ids:
            return self._finish(FinishReason.STOP, model.decode(self.generated[:-1]))
        # A row under a grammar ends where its JSON does: a stop string would cut it.
        if self.item.stop and self.item.response_format is None:
            # Decode the whole continuation: a stop string may span tokens, and a token may
            # complete a multi-byte character that only then matches.
            text = self.decoded(model)
            cut = min((i for s in self.item.stop if (i := text.find(s)) >= 0), default=-1)
            if cut >= 0:
                return self._finish(FinishReason.STOP, text[:cut])
        if self.tokens >= self.budget:
            return self._finish(FinishReason.LENGTH, self.decoded(model))
        return False

    def decoded(self, model: Detokenizer) -> str:
        """The whole continuation's text, decoded once per token count."""
        if self._decoded[0] != self.tokens:
            self._decoded = (self.tokens, model.decode(self.generated))
        return self._decoded[1]

    def stream_text(self, model: Detokenizer) -> str:
        """Its text as far as it may be published (text_stream.py): all of it once
        finished."""
        if self.finished:
            return self.text
        return publishable(self.decoded(model), holdback(self.item.stop))

    def _finish(self, reason: FinishReason, text: str) -> bool:
        self.finish_reason = reason
        self.text = text
        return True

    def result(self) -> TextResult:
        assert self.finish_reason is not None, "only a finished sequence has a result"
        return TextResult(text=self.text, finish_reason=self.finish_reason, tokens=self.tokens,
                          prompt_tokens=self.prompt_tokens, logprobs=self.logprobs)


def _entry(model: Detokenizer, token: int, score: Score) -> TokenLogprob:
    logprob, top = score

    def spelled(t: int, lp: float) -> TopLogprob:
        text, raw = model.spell(t)
        return TopLogprob(token=text, bytes=list(raw), logprob=lp)

    chosen = spelled(token, logprob)
    return TokenLogprob(token=chosen.token, bytes=chosen.bytes, logprob=logprob,
                        top_logprobs=[spelled(t, lp) for t, lp in top])
