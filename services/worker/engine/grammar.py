"""Structured output for the text decoder: JSON mode and JSON schemas, decoded under a grammar
(llguidance), the grammars compiled once per model and schema.

The pieces, for the decoder to call:

- `GrammarCache(tokenizer, vocab_size, eos_ids)`, one per text model: `get(schema)` gives the
  compiled `Grammar` of a schema (`None`: JSON mode, any object), compiled once per schema
  (keyed by shared/grammar_schema.py's `canonical`, its compact JSON with its members in
  order) and kept while among the `capacity` most recently used.
- `RowMatcher(grammar, budget)` (grammar_row.py), one per row: `fill_mask(row)` writes the
  tokens allowed next into a row of a bitmask, `accept(token)` advances it (False: the row
  writes `substitute` in the token's place), `is_terminated()` says nothing but an end token
  can follow. It ends the JSON within `budget` tokens.
- `new_bitmask`, `fill_masks` and `apply_masks` (grammar_mask.py): one int32 bitmask for all
  rows, filled on the host (llguidance's threads, the GIL released), applied to the logits
  in one call; rows without a grammar keep all their tokens.
- `check_schema` (shared/grammar_schema.py, no torch): the API's check of a schema, before
  queueing; the closing search is shared/grammar_close.py.

Why llguidance (benchmarks/grammar_cost.py measures the three maintained libraries; per token,
mask and advance, for a schema of four typed fields on a JSON document's tokens): xgrammar
took 3.4-6.0 us on the project's tokenizers (1,000 to 151,936 tokens), llguidance 6.9-13.0,
outlines-core 0.7 for the smallest vocabulary but 129 for the largest. xgrammar is the
fastest, but it requires torch and triton, and the API, which must compile a schema to refuse
it, installs without torch (its image checks so); outlines-core compiles a regular expression,
so it has no grammar for JSON mode's nesting, and its compile (1.1 s) and masks grow with the
vocabulary. llguidance has no dependencies and compiles lazily (0.4-0.7 ms a schema, a copy
of a compiled matcher 2 us): its per-token cost is a few percent of a decode step.
"""

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import llguidance
import llguidance.hf

from shared.errors import InvalidInput
from shared.grammar_close import close
from shared.grammar_schema import (
    JSON_OBJECT,
    MAX_SHORTEST_BYTES,
    SCHEMA_FIELD,
    canonical,
    check_schema,
    grammar_of,
)

__all__ = ["Grammar", "GrammarCache", "GrammarTokenizer", "check_schema"]

TOKENIZED_KEPT = 4096  # closings kept tokenized, per model


class GrammarTokenizer:
    """A model's tokenizer as llguidance sees it: its vocabulary as wide as the model's logits,
    its end tokens, and the token of each single byte (for the closings)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: Iterable[int]) -> None:
        """`tokenizer`: the model's fast Hugging Face tokenizer; `vocab_size`: its logits'
        width (a model may pad its vocabulary past the tokenizer's)."""
        self.vocab_size = vocab_size
        self.eos_ids = frozenset(eos_ids)
        self.ll = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size,
                                               eos_token=sorted(self.eos_ids))
        self.byte_ids: list[int | None] = [self._byte_id(b) for b in range(256)]
        # Closings repeat (the tail of a schema's object, the brackets of a nesting), and
        # tokenizing one costs ~50 us: they are kept, forgotten all at once when too many.
        self._tokens: dict[bytes, tuple[int, ...]] = {}

    def _byte_id(self, b: int) -> int | None:
        ids = self.ll.greedy_tokenize(chr(b)) if b < 0x80 else []
        if len(ids) == 1 and self.ll.decode_bytes(ids) == bytes((b,)):
            return ids[0]
        # Bytes past ASCII: byte-level vocabularies hold each as a token of its own.
        for t in self.ll.tokenize_bytes(bytes((b,))):
            if self.ll.decode_bytes([t]) == bytes((b,)):
                return t
        return None

    def tokens(self, data: bytes) -> list[int]:
        """`data` as this tokenizer writes it."""
        found = self._tokens.get(data)
        if found is None:
            if len(self._tokens) >= TOKENIZED_KEPT:
                self._tokens = {}
            found = self._tokens[data] = tuple(self.ll.tokenize_bytes(data))
        return list(found)


@dataclass(frozen=True, eq=False)
class Grammar:
    """A compiled grammar: a matcher at its start, which each row copies, and the tokens of the
    shortest output the closing search finds from there."""

    key: str
    tokenizer: GrammarTokenizer
    start: llguidance.LLMatcher
    shortest: tuple[int, ...]

    @property
    def min_tokens(self) -> int:
        """The fewest tokens a row under this grammar needs to end valid (`shortest`): a
        budget below it ends cut off."""
        return len(self.shortest)


class GrammarCache:
    """Compiled grammars of one model's tokenizer, by schema."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: Iterable[int],
                 capacity: int = 256) -> None:
        self.tokenizer = GrammarTokenizer(tokenizer, vocab_size, eos_ids)
        self.capacity = capacity
        self.hits = 0
        self.misses = 0
        self._grammars: OrderedDict[str, Grammar] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, schema: dict[str, Any] | None) -> Grammar:
        """The grammar of `schema`, or of JSON mode (any object) for None. Raises InvalidInput
        (shared/grammar_schema.check_schema) for a schema that cannot be decoded."""
        if schema is None:
            schema = JSON_OBJECT
        key = canonical(schema)
        with self._lock:
            found = self._grammars.get(key)
            if found is not None:
                self._grammars.move_to_end(key)
                self.hits += 1
                return found
        grammar = self._compile(key, schema)
        with self._lock:
            self.misses += 1
            self._grammars[key] = grammar
            while len(self._grammars) > self.capacity:
                self._grammars.popitem(last=False)
        return grammar

    def _compile(self, key: str, schema: dict[str, Any]) -> Grammar:
        check_schema(schema)
        tok = self.tokenizer
        start = llguidance.LLMatcher(tok.ll, grammar_of(schema), log_level=0)
        if start.is_error():  # the model's tokenizer, unlike check_schema's, cannot hold it
            raise InvalidInput(SCHEMA_FIELD, f"is not supported: {start.get_error()}")
        closing = close(start.deep_copy(), tok.byte_ids, b"", MAX_SHORTEST_BYTES)
        if closing is None:  # bytes the search needs that this tokenizer has no token for
            raise InvalidInput(SCHEMA_FIELD, "has no instance this model's tokenizer can write "
                                             f"in {MAX_SHORTEST_BYTES} bytes")
        return Grammar(key, tok, start, tuple(closing_tokens(start, tok, closing)))


def closing_tokens(matcher: llguidance.LLMatcher, tok: GrammarTokenizer,
                   closing: bytes) -> list[int]:
    """`closing` as tokens `matcher` takes from its state: as the tokenizer writes it, or byte
    by byte where the grammar refuses that tokenization (the grammar reads bytes, so the
    single bytes always fit)."""
    ids = tok.tokens(closing)
    if matcher.validate_tokens(ids) == len(ids):
        return ids
    return [t for t in (tok.byte_ids[b] for b in closing) if t is not None]
