"""Small byte-level BPE tokenizers trained offline, in the layouts CLIP and GPT-2 models load.

The training text is what ships with the installed packages (scikit-learn's dataset
descriptions and a fixed list of standard-library docstrings), so a build needs no network.
Byte-level BPE never produces unknown tokens, so any prompt still encodes; the vocabulary is
only small, which is all the random-weight test models need.
"""

import inspect
import json
from importlib import resources

from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import CLIPTokenizer, GPT2Tokenizer

# Fixed so that builds on any machine with the same package versions give the same vocabulary.
_DOCSTRING_MODULES = "builtins collections functools itertools json os pathlib re string textwrap"
EOS = "<|endoftext|>"
BOS = "<|startoftext|>"
_BYTES = sorted(pre_tokenizers.ByteLevel.alphabet())
# CLIP marks a word's last symbol ("t</w>"). For training, each byte symbol gets a twin from the
# private-use area standing for "<byte></w>", so word ends are ordinary alphabet characters.
_WORD_END = {char: chr(0xE000 + i) for i, char in enumerate(_BYTES)}
_FROM_WORD_END = {twin: char + "</w>" for char, twin in _WORD_END.items()}


def corpus() -> list[str]:
    """The training text: one string per document, in a fixed order."""
    texts = [
        entry.read_text(encoding="utf-8")
        for entry in sorted(
            resources.files("sklearn.datasets.descr").iterdir(), key=lambda e: e.name
        )
        if entry.name.endswith(".rst")
    ]
    for name in _DOCSTRING_MODULES.split():
        module = __import__(name)
        texts.append(inspect.getdoc(module) or "")
        for attr, value in sorted(vars(module).items()):
            # Constants would only repeat their type's docstring.
            doc = inspect.getdoc(value) if callable(value) and not attr.startswith("_") else None
            if doc:
                texts.append(doc)
    return texts


def _train(texts: list[str], vocab_size: int, special: list[str], extra=()) -> Tokenizer:
    """Train a byte-level BPE on `texts`, which must already be split into words by spaces."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        # Every byte is a base token, which is what makes the tokenizer total.
        initial_alphabet=[*_BYTES, *extra],
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def _byte_words(pre_tokenizer, texts: list[str], mark_ends: bool = False) -> list[str]:
    def word(symbols: str) -> str:
        return symbols[:-1] + _WORD_END[symbols[-1]] if mark_ends else symbols

    return [
        " ".join(word(symbols) for symbols, _ in pre_tokenizer.pre_tokenize_str(text))
        for text in texts
    ]


def _clip_symbol(token: str) -> str:
    twin = token[-1]
    return token[:-1] + _FROM_WORD_END[twin] if twin in _FROM_WORD_END else token


def _vocab_and_merges(
    tokenizer: Tokenizer, special: list[str], base: list[str], rename=lambda token: token
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Number the vocabulary canonically: specials, sorted base symbols, merges in order."""
    model = json.loads(tokenizer.to_str())["model"]
    merges = [
        (rename(a), rename(b))
        for a, b in (m if isinstance(m, list) else m.split(" ") for m in model["merges"])
    ]
    vocab: dict[str, int] = {}
    for token in [*special, *sorted(base), *(a + b for a, b in merges)]:
        vocab.setdefault(token, len(vocab))
    return vocab, merges


def train_clip_tokenizer(vocab_size: int = 1000, model_max_length: int = 77) -> CLIPTokenizer:
    """A CLIP-style tokenizer (lower-cased, `</w>` word ends) for tiny text encoders."""
    # Split text with the CLIP tokenizer's own normalizer and pre-tokenizer, so training sees
    # words exactly as encoding later will.
    backend = CLIPTokenizer().backend_tokenizer
    texts = [backend.normalizer.normalize_str(text) for text in corpus()]
    # The trainer's own `end_of_word_suffix` numbers the suffixed symbols in hash order, which
    # makes tie-breaks, and so the merges, differ between runs; the twins are sorted instead.
    words = _byte_words(backend.pre_tokenizer, texts, mark_ends=True)
    trained = _train(words, vocab_size, [BOS, EOS], extra=sorted(_FROM_WORD_END))
    vocab, merges = _vocab_and_merges(
        trained, [BOS, EOS], [*_BYTES, *_FROM_WORD_END.values()], _clip_symbol
    )
    return CLIPTokenizer(
        vocab=vocab,
        # transformers annotates merges as str | list[str]; the tokenizers BPE it feeds takes
        # (left, right) pairs
        merges=merges,  # type: ignore[arg-type]
        bos_token=BOS,
        eos_token=EOS,
        unk_token=EOS,
        pad_token=EOS,
        model_max_length=model_max_length,
    )


def train_gpt2_tokenizer(
    vocab_size: int = 1000, model_max_length: int = 1024, texts: list[str] | None = None
) -> GPT2Tokenizer:
    """A GPT-2-style tokenizer that pads on the left, as batched generation needs, trained on
    `texts` (by default the small built-in corpus)."""
    texts = corpus() if texts is None else texts
    words = _byte_words(pre_tokenizers.ByteLevel(add_prefix_space=False), texts)
    trained = _train(words, vocab_size, [EOS])
    vocab, merges = _vocab_and_merges(trained, [EOS], _BYTES)
    return GPT2Tokenizer(
        vocab=vocab,
        merges=merges,  # type: ignore[arg-type]  # pairs, as for CLIPTokenizer above
        bos_token=EOS,
        eos_token=EOS,
        unk_token=EOS,
        pad_token=EOS,
        padding_side="left",
        model_max_length=model_max_length,
    )
