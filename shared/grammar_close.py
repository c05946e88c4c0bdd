"""A short way to end a JSON text a grammar has begun: the bytes that take an llguidance matcher
from its state to one where its grammar accepts.

llguidance offers no shortest completion, only the bytes a state forces (`compute_ff_bytes`)
and trial consumption (`try_consume_tokens`, which leaves the state alone when the token does
not fit). The search is greedy over single-byte tokens: take the forced bytes; else the first
byte, in an order that closes JSON soonest, that the grammar allows. Inside a string that
order starts with the closing quote; outside, with `}` and `]`, then `,` (where a schema wants
more members or items before it lets an object or array close: before the digits, or a number
would grow without end), the shortest values (`0`, `""`), `:`, and the letters that start
`true`, `null` and `false`); after a token that stopped inside a character of
several bytes, the continuation bytes. Which of the two orders applies is read off the
bytes written (a JSON string starts and ends at an unescaped quote).

Greedy is not always the shortest (an optional key that sorts first can be taken before a
required one), but it always ends where the grammar accepts, and a row that follows it
exactly fits its budget: that is all the budget rule in grammar_row.py needs of it.
"""

from string import ascii_letters, digits, printable

import llguidance

_OTHER = bytes(b for b in printable.encode() if b not in b" \t\n\r\x0b\x0c")
OUTSIDE = b'}],0":tnf-123456789{[.eE+'
OUTSIDE += bytes(b for b in _OTHER if b not in OUTSIDE)
INSIDE = b'"' + (ascii_letters + digits).encode() + b" _-."
INSIDE += bytes(b for b in _OTHER if b not in INSIDE and b != ord("\\")) + b"\\"
# A token may end inside a character of several bytes: only its continuation bytes fit then.
INSIDE += bytes(range(0x80, 0xC0))


class StringState:
    """Whether the JSON written so far is inside a string, fed the bytes as they come."""

    def __init__(self) -> None:
        self.inside = False
        self.escaped = False

    def copy(self) -> "StringState":
        state = StringState()
        state.inside, state.escaped = self.inside, self.escaped
        return state

    def feed(self, data: bytes) -> None:
        inside, escaped = self.inside, self.escaped
        for b in data:
            if escaped:
                escaped = False
            elif b == 0x22:  # "
                inside = not inside
            elif inside and b == 0x5C:  # backslash
                escaped = True
        self.inside, self.escaped = inside, escaped


def close(matcher: llguidance.LLMatcher, byte_ids: list[int | None], written: bytes | StringState,
          limit: int) -> bytes | None:
    """The bytes that take `matcher` (consumed: pass a copy) to a state its grammar accepts,
    after `written` (the bytes it has taken, or their `StringState`); None past `limit` bytes
    or when no byte fits. `byte_ids[b]` is the token of the single byte b, where there is one."""
    if isinstance(written, StringState):
        state = written.copy()
    else:
        state = StringState()
        state.feed(written)
    out = bytearray()
    while not matcher.is_accepting():
        if len(out) > limit:
            return None
        step = matcher.compute_ff_bytes()
        if step:
            ids = [byte_ids[b] for b in step]
            if any(t is None for t in ids) or not matcher.consume_tokens(
                    [t for t in ids if t is not None]):
                return None
        else:
            for b in INSIDE if state.inside else OUTSIDE:
                t = byte_ids[b]
                if t is not None and matcher.try_consume_tokens([t]) == 1:
                    step = bytes((b,))
                    break
            else:
                return None
        out += step
        state.feed(step)
    return bytes(out)
