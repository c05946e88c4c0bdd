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
_DOCSTRING_MODULES = (
    "builtins", "collections", "functools", "itertools", "json", "os", "pathlib", "re",
    "string", "textwrap",
)
EOS = "<|endoftext|>"
BOS = "<|startoftext|>"
# Marks word ends during CLIP training; outside the byte-level alphabet, so never in real text.
_WORD_END = "\u2581"


def corpus() -> list[str]:
    """The training text: one string per document, in a fixed order."""
    texts = [
        entry.read_text(encoding="utf-8")
        for entry in sorted(
            resources.files("sklearn.datasets.descr").iterdir(), key=lambda e: e.name
        )
        if entry.name.endswith(".rst")
    ]
    for name in _DOCSTRING_MODULES:
        module = __import__(name)
        texts.append(inspect.getdoc(module) or "")
        for attr, value in sorted(vars(module).items()):
            # Constants would only repeat their type's docstring.
            doc = inspect.getdoc(value) if callable(value) and not attr.startswith("_") else None
            if doc:
                texts.append(doc)
    return texts


def _train(texts: list[str], vocab_size: int, special: list[str], extra: str = "") -> Tokenizer:
    """Train a byte-level BPE on `texts`, which must already be split into words by spaces."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        # Every byte is a base token, which is what makes the tokenizer total.
        initial_alphabet=[*pre_tokenizers.ByteLevel.alphabet(), *extra],
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def _byte_words(pre_tokenizer, texts: list[str], word_end: str = "") -> list[str]:
    return [
        " ".join(word + word_end for word, _ in pre_tokenizer.pre_tokenize_str(text))
        for text in texts
    ]


def _vocab_and_merges(
    tokenizer: Tokenizer, special: list[str], rename=lambda token: token
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Renumber the trained vocabulary canonically: specials, sorted base symbols, merges."""
    model = json.loads(tokenizer.to_str())["model"]
    merges = [
        (rename(a), rename(b))
        for a, b in (m if isinstance(m, list) else m.split(" ") for m in model["merges"])
    ]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    # Merges whose result is already a base symbol (a CLIP "<byte></w>") are no-ops.
    base = {*alphabet, *(rename(c + _WORD_END) for c in alphabet)} - {_WORD_END, ""}
    merges = [m for m in merges if m[0] + m[1] not in base]
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
    # makes tie-breaks, and so the merges, differ between runs. A plain end-of-word character
    # is part of the sorted alphabet instead; it becomes "</w>" afterwards.
    trained = _train(
        _byte_words(backend.pre_tokenizer, texts, _WORD_END),
        vocab_size,
        [BOS, EOS],
        extra=_WORD_END,
    )
    vocab, merges = _vocab_and_merges(
        trained, [BOS, EOS], lambda token: token.replace(_WORD_END, "</w>")
    )
    return CLIPTokenizer(
        vocab=vocab,
        merges=merges,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=EOS,
        pad_token=EOS,
        model_max_length=model_max_length,
    )


def train_gpt2_tokenizer(vocab_size: int = 1000, model_max_length: int = 1024) -> GPT2Tokenizer:
    """A GPT-2-style tokenizer that pads on the left, as batched generation needs."""
    words = _byte_words(pre_tokenizers.ByteLevel(add_prefix_space=False), corpus())
    vocab, merges = _vocab_and_merges(_train(words, vocab_size, [EOS]), [EOS])
    return GPT2Tokenizer(
        vocab=vocab,
        merges=merges,
        bos_token=EOS,
        eos_token=EOS,
        unk_token=EOS,
        pad_token=EOS,
        padding_side="left",
        model_max_length=model_max_length,
    )
