"""Structured output (engine/grammar*.py): whatever the logits, a row under a grammar writes
JSON that parses, and validates against its schema, within its token budget.

The logits are seeded random numbers over the real tokenizers' vocabularies (a random-weight
model, the honest test), picked greedily and sampled through the decoder's own `pick`."""

import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch

from services.worker.engine.grammar import GrammarCache
from services.worker.engine.grammar_mask import (
    apply_masks,
    fill_masks,
    new_bitmask,
    shifted,
    unpacked,
)
from services.worker.engine.grammar_row import RowMatcher
from services.worker.engine.text_sampling import N_PARAMS, params_of, pick
from shared.errors import InvalidInput
from shared.grammar_schema import check_schema
from shared.settings import REPO_ROOT

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "color", "tags"],
    "additionalProperties": False,
}
# Nesting and optional members: a token can open much more than it closes.
NESTED: dict[str, Any] = {
    "type": "object",
    "properties": {
        "items": {"type": "array", "items": {
            "type": "object",
            "properties": {"id": {"type": "integer"},
                           "sub": {"type": "array", "items": {"type": "array",
                                                              "items": {"type": "number"}}}},
            "required": ["id"]}},
        "note": {"type": "string"},
        "flag": {"type": "boolean"},
    },
    "required": ["items"],
}
BUDGETS = (8, 16, 32, 64)


# Where the built test models are (tiny-gpt2); the committed ones (pydoc-gpt2) are in models/.
_BUILT: list[Path] = []


@pytest.fixture(autouse=True, scope="module")
def _built_models(model_dir: Path) -> None:
    _BUILT[:] = [model_dir]


class Model:
    """A tokenizer of the project's models and its grammar cache."""

    def __init__(self, name: str) -> None:
        from transformers import AutoTokenizer

        built = _BUILT[0] / name if _BUILT else None
        folder = built if built is not None and built.exists() else REPO_ROOT / "models" / name
        self.tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        self.vocab = len(self.tok)
        self.eos = self.tok.eos_token_id
        self.grammars = GrammarCache(self.tok, self.vocab, [self.eos])


@cache
def model(name: str) -> Model:
    return Model(name)


def decode(m: Model, schema: dict[str, Any] | None, budget: int, seed: int,
           temperature: float) -> tuple[str, RowMatcher, int]:
    """One row's text under the grammar of `schema` (None: JSON mode) with random logits:
    masked, then picked as the decoder picks (greedy at temperature 0). The row matcher, and
    how many of its tokens were refused and replaced."""
    gen = torch.Generator().manual_seed(seed)
    row = RowMatcher(m.grammars.get(schema), budget)
    bitmask = new_bitmask(1, m.vocab)
    params = torch.tensor([params_of(temperature, 0, 1.0)], dtype=torch.float32).T
    assert params.shape == (N_PARAMS, 1)
    out: list[int] = []
    replaced = 0
    for _ in range(budget):
        assert fill_masks(bitmask, [row])
        logits = torch.randn(1, m.vocab, generator=gen) * 4
        apply_masks(logits, bitmask)
        uniform = torch.rand(1, generator=gen)
        token = int(pick(logits, params, uniform, temperature > 0)[0])
        if not row.accept(token):
            replaced += 1
            assert row.substitute is not None
            token = row.substitute
        if token == m.eos:
            assert row.is_terminated()
            break
        out.append(token)
    return str(m.tok.decode(out)), row, replaced


@pytest.mark.parametrize("name", ["tiny-gpt2", "pydoc-gpt2"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_mode_writes_an_object_within_any_budget(name: str, temperature: float) -> None:
    m = model(name)
    replaced = 0
    for budget in BUDGETS:
        for seed in range(12):
            text, row, n = decode(m, None, budget, seed, temperature)
            replaced += n
            assert isinstance(json.loads(text), dict), (budget, seed, text)
            assert not row.overran
    # The budget ran short for random logits, and the rule closed the objects.
    assert replaced > 0


@pytest.mark.parametrize("name", ["tiny-gpt2", "pydoc-gpt2"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("schema", [SCHEMA, NESTED], ids=["fields", "nested"])
def test_a_schema_is_met_within_any_budget_that_can_hold_it(
        name: str, temperature: float, schema: dict[str, Any]) -> None:
    m = model(name)
    least = m.grammars.get(schema).min_tokens
    budgets = sorted({least, least + 1, least + 3, *(b for b in BUDGETS if b > least)})
    for budget in budgets:
        for seed in range(10):
            text, row, _ = decode(m, schema, budget, seed, temperature)
            jsonschema.validate(json.loads(text), schema)
            assert not row.overran
            assert row.left >= 0


# Strings a format or pattern shapes, bounded numbers and arrays, non-ASCII enum values,
# alternatives and a recursive definition: the closing must find its way through each.
SHAPED: list[dict[str, Any]] = [
    {"type": "object", "required": ["e", "u", "d"], "properties": {
        "e": {"type": "string", "format": "email"},
        "u": {"type": "string", "format": "uuid"},
        "d": {"type": "string", "format": "date"}}},
    {"type": "object", "required": ["p", "s"], "properties": {
        "p": {"type": "string", "pattern": "^[a-z]{2}-[0-9]{3}$"},
        "s": {"type": "string", "minLength": 3, "maxLength": 8}}},
    {"type": "object", "required": ["n", "x", "a"], "properties": {
        "n": {"type": "integer", "minimum": 100, "maximum": 5000},
        "x": {"type": "number", "minimum": -1.5, "maximum": 2.5},
        "a": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4}}},
    {"type": "object", "required": ["c", "b", "z", "o"], "properties": {
        "c": {"enum": ["café", "naïve", "日本"]}, "b": {"type": "boolean"}, "z": {"type": "null"},
        "o": {"anyOf": [{"type": "string"},
                        {"type": "object", "properties": {"k": {"type": "integer"}},
                         "required": ["k"]}]}}},
    {"type": "object", "required": ["t"], "properties": {"t": {"$ref": "#/$defs/tree"}},
     "$defs": {"tree": {"type": "object", "required": ["v"], "properties": {
         "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/tree"}}}}}},
]


@pytest.mark.parametrize("schema", SHAPED, ids=["formats", "patterns", "numbers", "choices",
                                                "recursive"])
def test_shaped_strings_and_numbers_are_met_too(schema: dict[str, Any]) -> None:
    m = model("pydoc-gpt2")
    least = m.grammars.get(schema).min_tokens
    # Python's date type has no year 0, which RFC 3339's full-date (and so the grammar) allows:
    # dates are checked by the grammar alone.
    formats = jsonschema.FormatChecker(formats=["email", "uuid"])
    for budget in (least, least + 2, least + 10):
        for seed in range(6):
            for temperature in (0.0, 1.0):
                text, _, _ = decode(m, schema, budget, seed, temperature)
                jsonschema.validate(json.loads(text), schema, format_checker=formats)


def test_a_budget_below_the_shortest_output_is_said_to_overrun() -> None:
    m = model("pydoc-gpt2")
    grammar = m.grammars.get(SCHEMA)
    shortest = str(m.tok.decode(list(grammar.shortest)))
    jsonschema.validate(json.loads(shortest), SCHEMA)
    assert RowMatcher(grammar, grammar.min_tokens - 1).overran
    assert not RowMatcher(grammar, grammar.min_tokens).overran


def test_the_qwen_shaped_vocabulary() -> None:
    from benchmarks.qwen_shape import _tokenizer

    m = Model.__new__(Model)
    m.tok = _tokenizer()
    m.vocab, m.eos = len(m.tok), m.tok.eos_token_id
    m.grammars = GrammarCache(m.tok, m.vocab, [m.eos])
    assert m.vocab == 151_936
    for seed in range(3):
        text, _, _ = decode(m, None, 16, seed, 1.0)
        assert isinstance(json.loads(text), dict)
        text, _, _ = decode(m, SCHEMA, 64, seed, 0.0)
        jsonschema.validate(json.loads(text), SCHEMA)


def _allowed(bitmask_row: torch.Tensor, vocab: int) -> set[int]:
    words = bitmask_row.tolist()
    return {t for t in range(vocab) if (words[t >> 5] >> (t & 31)) & 1}


def test_the_end_token_is_allowed_only_where_the_grammar_accepts() -> None:
    m = model("pydoc-gpt2")
    row = RowMatcher(m.grammars.get(SCHEMA), 200)
    bitmask = new_bitmask(1, m.vocab)
    text = json.dumps({"name": "x", "age": 3, "color": "red", "tags": ["a"]})
    for token in m.tok.encode(text):
        row.fill_mask(bitmask[0])
        allowed = _allowed(bitmask[0], m.vocab)
        assert m.eos not in allowed
        assert token in allowed
        assert row.accept(token)
    assert row.is_terminated()
    row.fill_mask(bitmask[0])
    assert _allowed(bitmask[0], m.vocab) == {m.eos}
    assert row.accept(m.eos)


def test_rows_without_a_grammar_keep_their_logits() -> None:
    m = model("tiny-gpt2")
    schema = m.grammars.get(SCHEMA)
    # Free rows (their masks filled together by llguidance's threads) and a row whose budget
    # holds just the shortest output (its closing forced from the first token).
    rows = [None, RowMatcher(schema, 64), None, RowMatcher(m.grammars.get(None), 64),
            RowMatcher(schema, schema.min_tokens)]
    bitmask = new_bitmask(len(rows), m.vocab)
    bitmask.zero_()  # whatever an earlier step left there
    assert fill_masks(bitmask, rows)
    assert not fill_masks(new_bitmask(2, m.vocab), [None, None])
    alone = new_bitmask(1, m.vocab)
    for i, r in enumerate(rows):
        if r is not None:
            r.fill_mask(alone[0])
            assert torch.equal(alone[0], bitmask[i])
    assert _allowed(bitmask[4], m.vocab) == {schema.shortest[0]}
    assert m.tok.encode("{")[0] in _allowed(bitmask[1], m.vocab)
    assert m.eos not in _allowed(bitmask[1], m.vocab)
    logits = torch.randn(len(rows), m.vocab, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    apply_masks(logits, bitmask)
    assert torch.equal(logits[0], before[0])
    assert torch.equal(logits[2], before[2])
    for i in (1, 3, 4):
        kept = sorted(torch.isfinite(logits[i]).nonzero()[:, 0].tolist())
        assert set(kept) == _allowed(bitmask[i], m.vocab)
        assert torch.equal(logits[i][kept], before[i][kept])


@pytest.mark.parametrize("way", [unpacked, shifted], ids=["cpu", "accelerator"])
def test_applying_a_bitmask_is_its_bits_one_by_one(way: Callable[..., None]) -> None:
    gen = torch.Generator().manual_seed(1)
    vocab = 1000  # not a multiple of 32: the last word's high bits are past the vocabulary
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, (vocab + 31) // 32), generator=gen,
                            dtype=torch.int32)
    bitmask[1] = -1  # a row without a grammar, among rows with one
    logits = torch.randn(3, vocab, generator=gen)
    expected = logits.clone()
    for r in range(3):
        for t in range(vocab):
            if not (int(bitmask[r, t >> 5]) >> (t & 31)) & 1:
                expected[r, t] = float("-inf")
    way(logits, bitmask)
    assert torch.equal(logits, expected)
    assert torch.isinf(logits[0]).any() and torch.isinf(logits[2]).any()
    assert torch.isfinite(logits[1]).all()


def test_a_schema_compiles_once_per_model() -> None:
    m = Model("tiny-gpt2")
    first = m.grammars.get(SCHEMA)
    assert (m.grammars.hits, m.grammars.misses) == (0, 1)
    # The same schema, written again (another dict, members in the same order): a hit.
    assert m.grammars.get(json.loads(json.dumps(SCHEMA, indent=2))) is first
    assert (m.grammars.hits, m.grammars.misses) == (1, 1)
    # Its properties in another order are written in that order: another grammar.
    reordered = {**SCHEMA, "properties": dict(reversed(SCHEMA["properties"].items()))}
    assert m.grammars.get(reordered) is not first
    assert m.grammars.get(None) is m.grammars.get({"type": "object"})
    assert (m.grammars.hits, m.grammars.misses) == (2, 3)


def test_the_cache_keeps_the_most_recently_used() -> None:
    m = Model("tiny-gpt2")
    m.grammars.capacity = 2
    schemas = [{"type": "object", "properties": {f"k{i}": {"type": "integer"}}}
               for i in range(3)]
    for s in schemas:
        m.grammars.get(s)
    m.grammars.get(schemas[2])
    assert m.grammars.hits == 1
    m.grammars.get(schemas[0])  # dropped for the third
    assert m.grammars.misses == 4


@pytest.mark.parametrize(("schema", "reason"), [
    ([1, 2], "must be a JSON object"),
    ({"type": "strin"}, "strin"),
    ({"type": "string", "format": "no-such-format"}, "no-such-format"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/nowhere"}}}, "nowhere"),
    # An object that requires itself has no finite instance.
    ({"$ref": "#/$defs/x", "$defs": {"x": {"type": "object", "required": ["n"],
                                           "properties": {"n": {"$ref": "#/$defs/x"}}}}},
     "no instance shorter than"),
])
def test_a_schema_the_decoder_cannot_write_is_refused(schema: Any, reason: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        check_schema(schema)
    assert caught.value.field == "response_format.json_schema.schema"
    assert reason in caught.value.message
    if isinstance(schema, dict):
        with pytest.raises(InvalidInput):
            model("tiny-gpt2").grammars.get(schema)


def test_a_schema_a_models_tokenizer_cannot_write_is_refused() -> None:
    m = Model("tiny-gpt2")
    m.grammars.tokenizer.byte_ids[ord("}")] = None  # as a vocabulary without the byte alone
    with pytest.raises(InvalidInput) as caught:
        m.grammars.get(SCHEMA)
    assert caught.value.field == "response_format.json_schema.schema"
    assert "this model's tokenizer" in caught.value.message


def test_a_supported_schema_passes() -> None:
    check_schema(SCHEMA)
    check_schema(NESTED)
    check_schema({"type": "object"})
