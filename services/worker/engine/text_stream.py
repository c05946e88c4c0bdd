"""A text row's output while it decodes: what of its text may be published, and the hook that
hears it after every read of the tokens (`on_text`, on the device thread).

Published deltas must add up to the final text exactly, so only text no later token can change
is published: the decoded continuation without a trailing incomplete character (decoding gives
U+FFFD until the token holding the character's last byte arrives), and, when the item has stop
strings, without its last (longest stop - 1) characters, which may yet begin one. This relies on
decoding being prefix-stable, as byte-level BPE without `clean_up_tokenization_spaces` is.
"""

from collections.abc import Callable
from dataclasses import dataclass

from shared.messages import FinishReason, TokenLogprob

INCOMPLETE = "\ufffd"


def holdback(stops: list[str]) -> int:
    """Characters kept back while decoding: the most a stop string can have before its end."""
    return max((len(s) for s in stops), default=1) - 1


def publishable(text: str, held: int) -> str:
    """The part of a decoding row's text that later tokens cannot change. A replacement
    character that the holdback leaves at the end is kept back too: it is final there (more
    text follows it), but a client cannot tell it from one still waiting for its bytes."""
    text = text.rstrip(INCOMPLETE)
    return text[:max(0, len(text) - held)].rstrip(INCOMPLETE)


@dataclass(frozen=True)
class TextUpdate:
    """A text row after a read that advanced it, as its `on_text` hook sees it."""

    tokens: int  # generated so far
    prompt_tokens: int
    finish_reason: FinishReason | None  # set once it finished: `text()` is then its final text
    # The text that may be published so far; it decodes when called, so a hook that publishes
    # only now and then costs no decoding in between.
    text: Callable[[], str]
    # Every generated token's log-probability so far, when its item asked for them (the
    # row's own list, read on the device thread that appends to it).
    logprobs: list[TokenLogprob] | None = None


OnText = Callable[[TextUpdate], None]
