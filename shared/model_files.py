"""A model's files on disk, read without torch or transformers (the API reads them too): where
its folder is, its context length, its tokenizer and chat template, and what it lacks.

A registry `path` is the model's folder; or a Hugging Face cache folder of one repo
(`models--org--name`, holding `refs/` and `snapshots/`); or, with `hf_cache`, a repo id in
that cache. A cache resolves to the snapshot its `revision` names (a ref, or a commit), which
is read as a plain folder: nothing is ever downloaded.
"""

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from shared.errors import ModelFilesMissing, ModelNotLoadable
from shared.registry import ModelKind, ModelSpec

# A text model whose config names no position limit: its slots hold this many tokens.
DEFAULT_CONTEXT = 2048
# Where configs of the families in use state their position limit, first found wins.
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length",
                 "seq_length", "max_seq_len", "n_ctx")
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
           "pytorch_model.bin.index.json")
TOKENIZER = "tokenizer.json"


def model_folder(spec: ModelSpec) -> Path:
    """The folder the model's files are in; ModelFilesMissing when a cache lacks the
    snapshot asked for. A plain folder is returned as it is, present or not."""
    try:
        return _folder(spec.path, spec.hf_cache, spec.revision)
    except ModelFilesMissing as exc:
        raise ModelFilesMissing(f"model {spec.name}: {exc}") from None


@lru_cache(maxsize=256)
def _folder(path: Path, hf_cache: Path | None, revision: str) -> Path:
    if hf_cache is not None:
        repo = hf_cache / ("models--" + "--".join(path.parts))
    elif (path / "snapshots").is_dir():
        repo = path
    else:
        return path
    ref = repo / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    snapshot = repo / "snapshots" / commit
    if not snapshot.is_dir():
        raise ModelFilesMissing(
            f"{repo}: no snapshot for revision {revision!r} (neither refs/{revision} nor "
            f"snapshots/{revision}); fill the cache where the network is, then copy it here")
    return snapshot


def visible_folder(spec: ModelSpec) -> Path | None:
    """The model's folder when this process can see its files (an API replica need not)."""
    try:
        folder = model_folder(spec)
    except ModelFilesMissing:
        return None
    return folder if folder.is_dir() else None


@lru_cache(maxsize=256)
def _json(path: Path) -> dict[str, Any] | None:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def positions(config: dict[str, Any]) -> int | None:
    """The longest sequence a model's config.json says it takes (a multimodal model's in its
    text config)."""
    for key in POSITION_KEYS:
        if isinstance(config.get(key), int):
            return int(config[key])
    text = config.get("text_config")
    return positions(text) if isinstance(text, dict) else None


def context_length(spec: ModelSpec) -> int | None:
    """A text model's context (prompt plus new tokens at most): the registry's `max_context`,
    else its config's; None for image models, and where the files cannot be seen."""
    if spec.kind != ModelKind.CAUSAL_LM:
        return None
    if spec.max_context is not None:
        return spec.max_context
    folder = visible_folder(spec)
    config = None if folder is None else _json(folder / "config.json")
    if config is None:
        return None
    return positions(config) or DEFAULT_CONTEXT


def tokenizer_file(spec: ModelSpec) -> Path | None:
    """A text model's tokenizer.json, where this process can see it."""
    folder = visible_folder(spec) if spec.kind == ModelKind.CAUSAL_LM else None
    path = None if folder is None else folder / TOKENIZER
    return path if path is not None and path.is_file() else None


def chat_template(spec: ModelSpec) -> str | None:
    """The registry's chat template, else the tokenizer's own (chat_template.jinja, or
    tokenizer_config.json's `chat_template`, its `default` one when it names several)."""
    if spec.chat_template is not None or spec.kind != ModelKind.CAUSAL_LM:
        return spec.chat_template
    folder = visible_folder(spec)
    return None if folder is None else _tokenizer_template(folder)


@lru_cache(maxsize=64)
def _tokenizer_template(folder: Path) -> str | None:
    try:
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    except OSError:
        pass
    found = (_json(folder / "tokenizer_config.json") or {}).get("chat_template")
    if isinstance(found, list):  # [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in found if isinstance(t, dict)}
        found = named.get("default", next(iter(named.values()), None))
    return found if isinstance(found, str) else None


def special_tokens(spec: ModelSpec) -> dict[str, str]:
    """The tokenizer's special tokens (bos_token, eos_token...), which chat templates read."""
    folder = visible_folder(spec)
    config = (None if folder is None else _json(folder / "tokenizer_config.json")) or {}
    tokens = {}
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = config.get(name)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            tokens[name] = value
    return tokens


def checked_folder(spec: ModelSpec) -> Path:
    """The folder a worker loads the model from, once it has what loading needs; otherwise
    one line naming the folder and each thing it lacks (ModelFilesMissing), or a registry
    `max_context` the model cannot take (ModelNotLoadable)."""
    folder = model_folder(spec)
    if not folder.is_dir():
        # Said before any library tries the folder name as a model hub id.
        raise ModelFilesMissing(
            f"model {spec.name}: {folder} does not exist (the registry's `path`); "
            "`make models` builds the demo and test models")
    if spec.kind != ModelKind.CAUSAL_LM:
        return folder
    lacks = [] if (folder / "config.json").is_file() else ["config.json"]
    if not any((folder / name).is_file() for name in WEIGHTS):
        lacks.append(f"weights ({' or '.join(WEIGHTS)})")
    if not (folder / TOKENIZER).is_file():
        lacks.append(f"a tokenizer ({TOKENIZER})")
    if lacks:
        raise ModelFilesMissing(f"model {spec.name}: {folder} lacks {', '.join(lacks)}")
    own = positions(_json(folder / "config.json") or {})
    if spec.max_context is not None and own is not None and spec.max_context > own:
        raise ModelNotLoadable(
            f"model {spec.name}: max_context {spec.max_context} is above the {own} positions "
            f"of {folder / 'config.json'}")
    return folder
