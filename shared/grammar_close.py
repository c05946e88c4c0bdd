"""A short way to end a JSON text a grammar has begun: the bytes that take an llguidance matcher
from its state to one where its grammar accepts.

llguidance offers no shortest completion, only the bytes a state forces (`compute_ff_bytes`)
and trial consumption (`try_consume_tokens`, which leaves the state alone when the token does
not fit). The search is greedy over single-byte tokens: take the forced bytes; else the first
byte, in an order that closes JSON soonest, that the grammar allows. Inside a string that
order starts with the closing quote, then the punctuation that formats put between runs of
letters and digits; outside, with `}` and `]`, then `,` (where a schema wants
more members or items before it lets an object or array close: before the digits, or a number
would grow without end), the shortest values (`0`, `""`), `:`, and the letters that start
`true`, `null` and `false`); after a token that stopped inside a character of
several bytes, the continuation bytes. Which of the two orders applies is read off the
bytes written (a JSON string starts and ends at an unescaped quote). Inside strings a byte
taken three times goes behind the others, so a repetition the grammar allows without end
cannot hold the search.

Greedy is not always the shortest (an optional key that sorts first can be taken before a
required one), but it always ends where the grammar accepts, and a row that follows it
exactly fits its budget: that is all the budget rule (services/worker/engine/grammar_row.py)
needs of it.
"""

from string import ascii_letters, digits, printable

import llguidance

_OTHER = bytes(b for b in printable.encode() if b not in b" \t\n\r\x0b\x0c")
OUTSIDE = b'}],0":tnf-123456789{[.eE+'
OUTSIDE += bytes(b for b in _OTHER if b not in OUTSIDE)
# Punctuation before letters: a format's separators (the `@` of an email, the `-` of a date)
# end a run of letters or digits that could go on; digits from 1, as a year 0000 is no date.
INSIDE = b'"-.:@_/+' + (ascii_letters + digits[1:] + "0").encode() + b" "
INSIDE += bytes(b for b in _OTHER if b not in INSIDE and b != ord("\\")) + b"\\"
# A token may end inside a character of several bytes: only its continuation bytes fit then.
INSIDE += bytes(range(0x80, 0xC0))
# Inside a string, a byte chosen this many times goes behind the others: a repetition the
# grammar allows without end (an email's `-` and `.` before its `@`) must not hold the search.
# Outside strings nothing repeats without end: each `}` or `]` closes something, and `,` comes
# before the digits.
MAX_USES = 3


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
    inside = INSIDE  # the order inside strings, the bytes used most moved back
    used = [0] * 256  # how often each byte was chosen inside a string
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
            was_inside = state.inside
            for b in inside if was_inside else OUTSIDE:
                t = byte_ids[b]
                if t is not None and matcher.try_consume_tokens([t]) == 1:
                    step = bytes((b,))
                    break
            else:
                return None
            if was_inside and step != b'"':
                used[step[0]] += 1
                if used[step[0]] % MAX_USES == 0:
                    inside = _reordered(used)
        out += step
        state.feed(step)
    return bytes(out)


def _reordered(used: list[int]) -> bytes:
    """The order inside strings with each byte behind those used fewer times (in rounds of
    `MAX_USES`), the closing quote always first."""
    rank = {b: i for i, b in enumerate(INSIDE)}

    def key(b: int) -> tuple[int, int]:
        return (0 if b == 0x22 else used[b] // MAX_USES, rank[b])

    order: list[int] = sorted(INSIDE, key=key)
    return bytes(order)
