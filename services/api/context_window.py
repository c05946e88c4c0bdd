"""A text job's prompts against its model's context: counted with the model's own tokenizer
(its tokenizer.json, through the `tokenizers` library: no torch), refused when a prompt and its
budget would not fit, never cut.

A budget left out is the model's default lowered to the room its longest prompt leaves (as
OpenAI's chat gives the room left), and written into the job's input; only a prompt that
leaves no room for one new token is refused then. A model whose files this replica cannot
see is not counted here: the worker still refuses what does not fit (pipelines/text.py).
"""

import asyncio
import logging
import time
from pathlib import Path

from tokenizers import Tokenizer

from shared.errors import ContextLengthExceeded
from shared.inputs import TextGenerationInput
from shared.model_files import context_length, tokenizer_file
from shared.registry import ModelSpec

log = logging.getLogger(__name__)

# Characters past which encoding leaves the event loop (a few milliseconds of Rust work).
INLINE_CHARS = 2000


# How long a model whose files this replica cannot see is taken as unseen before its folder is
# looked at again (a volume mounted late).
UNSEEN_RECHECK_SECONDS = 60.0


class ContextWindows:
    """Each model's context and tokenizer, found and loaded once (the tokenizer off the event
    loop): a request reads no file and no folder."""

    def __init__(self) -> None:
        self._tokenizers: dict[Path, Tokenizer | None] = {}
        self._loading = asyncio.Lock()
        self._unseen: set[str] = set()
        # By what decides a model's files: a registry reloaded with another path is new.
        self._windows: dict[tuple, tuple[int, Tokenizer]] = {}
        self._unseen_until: dict[tuple, float] = {}

    async def fit(self, spec: ModelSpec, inp: TextGenerationInput) -> None:
        """ContextLengthExceeded naming each prompt that does not fit with its budget; a
        budget left out is set to what fits, when the default would not."""
        window = await self._window(spec)
        if window is None:
            if spec.name not in self._unseen:
                self._unseen.add(spec.name)
                log.warning("model %s: no context length or tokenizer.json readable here; "
                            "its prompts are measured by the worker only", spec.name)
            return
        context, tokenizer = window
        counts = await _count(tokenizer, inp.prompts)
        longest = max(counts)
        if inp.max_new_tokens is None:
            room = context - longest
            if room < 1:
                raise _exceeded(spec, context, counts, None)
            if spec.defaults.max_new_tokens > room:
                inp.max_new_tokens = room
            return
        if longest + inp.max_new_tokens > context:
            raise _exceeded(spec, context, counts, inp.max_new_tokens)

    async def _window(self, spec: ModelSpec) -> tuple[int, Tokenizer] | None:
        key = (spec.name, spec.kind, spec.path, spec.hf_cache, spec.revision, spec.max_context)
        if (found := self._windows.get(key)) is not None:
            return found
        if time.monotonic() < self._unseen_until.get(key, 0.0):
            return None
        context, path = context_length(spec), tokenizer_file(spec)
        tokenizer = None if path is None else await self._tokenizer(path)
        if context is None or tokenizer is None:
            self._unseen_until[key] = time.monotonic() + UNSEEN_RECHECK_SECONDS
            return None
        self._windows[key] = (context, tokenizer)
        return context, tokenizer

    async def _tokenizer(self, path: Path) -> Tokenizer | None:
        if path not in self._tokenizers:
            async with self._loading:
                if path not in self._tokenizers:
                    self._tokenizers[path] = await asyncio.to_thread(_load, path)
        return self._tokenizers[path]


async def _count(tokenizer: Tokenizer, prompts: list[str]) -> list[int]:
    # Each distinct prompt once: `n` choices repeat theirs.
    distinct = list(dict.fromkeys(prompts))
    if sum(map(len, distinct)) <= INLINE_CHARS:
        encoded = tokenizer.encode_batch(distinct)
    else:
        encoded = await asyncio.to_thread(tokenizer.encode_batch, distinct)
    # An empty encoding still feeds the model one token (pipelines/text.py).
    counts = {p: max(1, len(e.ids)) for p, e in zip(distinct, encoded, strict=True)}
    return [counts[p] for p in prompts]


def _load(path: Path) -> Tokenizer | None:
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # a format this `tokenizers` cannot read: the worker measures
        log.warning("%s cannot be read: %s", path, exc)
        return None
    # A tokenizer saved with truncation or padding on would cut or pad the count.
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def _exceeded(spec: ModelSpec, context: int, counts: list[int],
              budget: int | None) -> ContextLengthExceeded:
    """Every prompt that does not fit, each as a problem of its own; the first one's counts
    are the error's (OpenAI's answer names one)."""
    need = 1 if budget is None else budget
    errors = [ContextLengthExceeded(f"input.prompts.{i}", spec.name, context, n, budget)
              for i, n in enumerate(counts) if n + need > context]
    first = errors[0]
    first.problems = [p for e in errors for p in e.problems]
    first.args = ("; ".join(f"{p.field}: {p.message}" for p in first.problems),)
    return first
