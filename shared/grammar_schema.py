"""What a `response_format` asks the text decoder to write, as an llguidance grammar, and the
check the API runs on a JSON schema before queueing it.

JSON mode (`{"type": "json_object"}`) is the grammar of any JSON object; a JSON schema
(`{"type": "json_schema", "json_schema": {"schema": {...}}}`) is the grammar of the JSON texts
that validate against it. Both write JSON as Python's `json.dumps` does (`", "` and `": "`
between items, no other whitespace): whitespace a random or confused model could fill its
budget with is never allowed, and the separators are the ones models have seen most. Properties
come in the schema's order. Every schema is held strictly, whatever `strict` says: a schema's
keywords that llguidance does not implement are refused, not ignored, so what the decoder
writes always validates.

This module imports neither torch nor transformers, so the API can check schemas with it.
"""

import json
from functools import cache
from typing import TYPE_CHECKING, Any

import llguidance

from shared.errors import InvalidInput
from shared.grammar_close import close

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

SCHEMA_FIELD = "response_format.json_schema.schema"
# How llguidance writes JSON (its JsonCompileOptions); "lenient": False refuses the keywords it
# does not implement instead of ignoring them.
JSON_OPTIONS: "JsonCompileOptions" = {"whitespace_flexible": False, "item_separator": ", ",
                                      "key_separator": ": ", "lenient": False}
# The schema of JSON mode: any object, with any members.
JSON_OBJECT: dict[str, Any] = {"type": "object"}
# A schema whose shortest instance is longer than this many bytes is refused: no budget a
# model allows would let it finish (and a schema with no finite instance at all, such as an
# object that requires itself, is caught here instead of in a decoder).
MAX_SHORTEST_BYTES = 4096


def canonical(schema: dict[str, Any]) -> str:
    """The cache key of a schema: its JSON with no spaces, members in their given order (the
    order is kept: it is the order the properties are written in)."""
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def grammar_of(schema: dict[str, Any]) -> str:
    """The llguidance grammar of the JSON texts that validate against `schema`."""
    return str(llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS))


def check_schema(schema: Any, field: str = SCHEMA_FIELD) -> None:
    """Refuse, before anything is queued, a JSON schema the decoder could not write: not an
    object, a keyword or form llguidance does not implement, or no instance shorter than
    `MAX_SHORTEST_BYTES`. Raises InvalidInput naming `field` and the reason."""
    if not isinstance(schema, dict):
        raise InvalidInput(field, f"must be a JSON object (a JSON schema), not "
                                  f"{type(schema).__name__}")
    try:
        grammar = grammar_of(schema)
    except (ValueError, TypeError) as exc:
        raise InvalidInput(field, f"is not a usable JSON schema: {exc}") from None
    matcher = llguidance.LLMatcher(_byte_tokenizer(), grammar, log_level=0)
    if matcher.is_error():
        raise InvalidInput(field, f"is not supported: {matcher.get_error()}")
    if shortest_bytes(matcher) is None:
        raise InvalidInput(field, f"has no instance shorter than {MAX_SHORTEST_BYTES} bytes, "
                                  "so no output could both end and validate against it")


def shortest_bytes(matcher: llguidance.LLMatcher) -> bytes | None:
    """What closes `matcher` (a byte tokenizer's, `_byte_tokenizer`) from its state, found as
    services/worker/engine/grammar_row.py's closing is; None past `MAX_SHORTEST_BYTES`."""
    return close(matcher.deep_copy(), _BYTE_IDS, b"", MAX_SHORTEST_BYTES)


# A tokenizer of the 256 bytes and an end token, for checking grammars where no model's
# tokenizer is at hand: a byte-level BPE without merges, as a tokenizer.json.
_EOS = 256
_BYTE_IDS: list[int | None] = list(range(256))


def _byte_level_chars() -> list[str]:
    """The characters byte-level BPE writes the 256 bytes as (GPT-2's table)."""
    shown = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
             *range(ord("®"), ord("ÿ") + 1)]
    chars: dict[int, str] = {b: chr(b) for b in shown}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


@cache
def _byte_tokenizer() -> llguidance.LLTokenizer:
    vocab = {char: b for b, char in enumerate(_byte_level_chars())}
    vocab["<eos>"] = _EOS
    byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    spec: dict[str, Any] = {
        "version": "1.0", "truncation": None, "padding": None, "normalizer": None,
        "post_processor": None,
        "added_tokens": [{"id": _EOS, "content": "<eos>", "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False,
                          "special": True}],
        "pre_tokenizer": {"type": "ByteLevel", **byte_level},
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    return llguidance.LLTokenizer(json.dumps(spec), n_vocab=_EOS + 1, eos_token=_EOS)
