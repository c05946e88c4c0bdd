"""Generated tokens' log-probabilities in OpenAI's two shapes: a chat's
`{"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}`, and a completion's
legacy `{tokens, token_logprobs, top_logprobs, text_offset}`. The same functions shape a whole
answer's and one streamed chunk's, so both read alike."""

import codecs
import math
from typing import Any

from shared.messages import TokenLogprob, TopLogprob

# OpenAI's stand-in for a log-probability too low to write (JSON has no -Infinity).
FLOOR = -9999.0


def entries(raw: list[Any] | None) -> list[TokenLogprob] | None:
    """An output's `logprobs` (the stored output's dicts, or an event's models) as models."""
    if raw is None:
        return None
    return [e if isinstance(e, TokenLogprob) else TokenLogprob.model_validate(e) for e in raw]


def _logprob(value: float) -> float:
    return FLOOR if math.isnan(value) else max(value, FLOOR)


def _top(t: TopLogprob) -> dict[str, Any]:
    return {"token": t.token, "logprob": _logprob(t.logprob), "bytes": t.bytes}


def chat(tokens: list[TokenLogprob]) -> dict[str, Any]:
    """A chat choice's (or chunk's) `logprobs`."""
    return {"content": [{**_top(t), "top_logprobs": [_top(a) for a in t.top_logprobs]}
                        for t in tokens], "refusal": None}


class TextOffsets:
    """Where each token of a completion starts in its choice's text, in characters. It follows
    the tokens' bytes, not their text: a character split across tokens is counted once, at the
    token that begins it, as the choice's text has it once."""

    def __init__(self, start: int = 0) -> None:
        self.offset = start  # the echoed prompt's length, when the text starts with it
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def next(self, token: TokenLogprob) -> int:
        at = self.offset
        self.offset += len(self._decoder.decode(bytes(token.bytes)))
        return at


def completion(tokens: list[TokenLogprob], offsets: TextOffsets) -> dict[str, Any]:
    """A completion choice's (or chunk's) `logprobs`. As OpenAI's, each place's top_logprobs
    holds the asked number of most likely tokens and the chosen one beside them when it is not
    among them (so with `logprobs: 0`, the chosen one alone)."""
    top: list[dict[str, float]] = []
    for t in tokens:
        place: dict[str, float] = {}
        for a in [*t.top_logprobs, t]:
            # Two tokens may read alike (bytes that are not whole characters): the likelier
            # one, met first, keeps the name.
            place.setdefault(a.token, _logprob(a.logprob))
        top.append(place)
    return {"tokens": [t.token for t in tokens],
            "token_logprobs": [_logprob(t.logprob) for t in tokens],
            "top_logprobs": top,
            "text_offset": [offsets.next(t) for t in tokens]}
