"""One row's place in its grammar, and the rule that ends its JSON within its token budget.

The row always holds a closing: tokens that take its grammar from where it is to where it
accepts (shared/grammar_close.py finds one; the compiled grammar holds the one from its start). The
rule keeps that closing no longer than the tokens left:

- each token written is checked against it: when the closing still ends the grammar after the
  token (one `validate_tokens` of the closing and an end token: a few microseconds), it stays;
  else (the token opened something: a string, an array, another member) a new one is searched
  from there;
- a token after which no closing fits the tokens left is refused: `accept` takes the
  closing's first token in its place and returns False, and the decoder writes that token
  instead (`substitute`) -- this happens only where the budget runs short, to a token that
  opened more than the tokens left can close;
- when the tokens left equal the closing's length, the mask allows the closing's next token
  alone, to its end; then the grammar accepts, and its mask allows only the end tokens.

So a row that runs out of budget still ends with JSON that parses and validates, whatever its
logits, with no budget kept in reserve; EOS is allowed only where the grammar accepts
(llguidance's mask holds the end tokens only there). A budget below the grammar's
`min_tokens` cannot hold any valid output: the row then writes the closing from the start and
is cut off by its budget (`overran`).

Why not mask the tokens that would not fit instead of replacing one: which tokens those are
depends on each token's own closing, and a mask covers the whole vocabulary (151,936 tokens
for Qwen's): checking each would cost far more than the step. Refusing the one token the
model picked costs one search.
"""

import llguidance
import torch

from services.worker.engine.grammar import Grammar, closing_tokens
from shared.grammar_close import StringState, close
from shared.grammar_schema import MAX_SHORTEST_BYTES


class RowMatcher:
    """One row under a grammar, with `budget` tokens to write."""

    def __init__(self, grammar: Grammar, budget: int) -> None:
        self.grammar = grammar
        self.left = budget
        # The row's place in the grammar: its own copy of the grammar's start.
        self.ll: llguidance.LLMatcher = grammar.start.deep_copy()
        self._closing = list(grammar.shortest)
        self.overran = len(self._closing) > budget
        # The token the last refused token was replaced with (`accept`).
        self.substitute: int | None = None
        self._eos = min(grammar.tokenizer.eos_ids)
        self._written: list[int] = []
        self._strings = StringState()
        self._read = 0  # tokens of `_written` fed to `_strings`

    @property
    def closing(self) -> list[int]:
        """The tokens that end the JSON from here: what the row writes if it must stop."""
        return list(self._closing)

    def forced_token(self) -> int | None:
        """The one token the budget allows next, when it allows only one (the closing's
        next); else None, and the next mask is the grammar's (`ll`'s)."""
        if self._closing and self.left <= len(self._closing):
            return self._closing[0]
        return None

    def fill_mask(self, row: torch.Tensor) -> None:
        """Write the tokens allowed next into `row`: one row of a CPU int32 bitmask
        (grammar_mask.new_bitmask), bit t of word t // 32 for token t."""
        forced = self.forced_token()
        if forced is not None:
            set_only(row, forced)
        else:
            self.ll.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())

    def accept(self, token: int) -> bool:
        """Advance past `token`, the one the row's mask let it pick. True when the row keeps
        it; False when it must write `substitute` in its place instead: the token leaves
        too few tokens to close the JSON (or the grammar refuses it: a token the mask did not
        allow), and the matcher has already advanced past the substitute."""
        self.substitute = None
        if self._closing and token == self._closing[0]:
            self._take(token)
            self._closing.pop(0)
            return True
        if token in self.grammar.tokenizer.eos_ids and self.ll.is_accepting():
            self._take(token)
            self._closing = []
            return True
        if self.ll.try_consume_tokens([token]) != 1:
            return self._refuse()
        closing = self._closing_after(token)
        if closing is None or len(closing) > self.left - 1:
            self.ll.rollback(1)
            return self._refuse()
        self.left -= 1
        self._written.append(token)
        self._closing = closing
        return True

    def is_terminated(self) -> bool:
        """Whether only an end token can follow (or one was written): the JSON is complete."""
        return bool(self.ll.is_stopped())

    def _take(self, token: int) -> None:
        # (trial consumption costs a fifth of `consume_token` here; an end token once the
        # grammar stopped is taken only by the latter)
        ok = (self.ll.try_consume_tokens([token]) == 1 or self.ll.consume_token(token))
        assert ok, f"a closing token the grammar refuses: {self.ll.get_error()}"
        self.left -= 1
        self._written.append(token)

    def _refuse(self) -> bool:
        if not self._closing:  # the grammar accepts already: only an end token fits
            self._take(self._eos)
            self.substitute = self._eos
            return False
        self.substitute = self._closing.pop(0)
        self._take(self.substitute)
        return False

    def _closing_after(self, token: int) -> list[int] | None:
        """A closing from here, `token` just taken: the one before, if it still ends the
        grammar (an end token after it is accepted only where the grammar accepts), else
        one searched anew."""
        if self.ll.is_stopped():
            return []
        kept = self._closing
        if self.ll.validate_tokens([*kept, self._eos]) == len(kept) + 1:
            return kept
        tok = self.grammar.tokenizer
        if self._read < len(self._written):
            self._strings.feed(tok.ll.decode_bytes(self._written[self._read:]))
            self._read = len(self._written)
        state = self._strings.copy()  # `token` may yet be refused
        state.feed(tok.ll.decode_bytes([token]))
        found = close(self.ll.deep_copy(), tok.byte_ids, state, MAX_SHORTEST_BYTES)
        if found is None:
            return None
        return closing_tokens(self.ll, tok, found)


def set_only(row: torch.Tensor, token: int) -> None:
    """A bitmask row that allows `token` alone."""
    words = row.numpy()  # numpy's item writes cost a tenth of torch's
    words[:] = 0
    bit = 1 << (token & 31)
    words[token >> 5] = bit - (1 << 32) if bit >= 1 << 31 else bit  # int32: bit 31 is the sign
