"""A model's context and tokenizer are found once per API process, not per request: a request
reads no file and looks at no folder, and a model whose files cannot be seen is looked at
again only after a while."""

import asyncio

import pytest

from services.api import context_window
from services.api.context_window import ContextWindows
from shared.errors import ContextLengthExceeded
from shared.inputs import TextGenerationInput
from shared.registry import load_registry


def _watched(monkeypatch) -> list[str]:
    looked: list[str] = []
    real = context_window.tokenizer_file

    def tokenizer_file(spec):
        looked.append(spec.name)
        return real(spec)

    monkeypatch.setattr(context_window, "tokenizer_file", tokenizer_file)
    return looked


def test_a_models_files_are_read_once_for_many_requests(model_dir, monkeypatch):
    looked = _watched(monkeypatch)
    spec = load_registry(model_dir / "registry.yaml").get("pydoc-gpt2")  # 128 positions
    windows = ContextWindows()

    async def requests():
        for _ in range(5):
            await windows.fit(spec, TextGenerationInput(prompts=["hello"], max_new_tokens=4))
        with pytest.raises(ContextLengthExceeded):
            await windows.fit(spec, TextGenerationInput(prompts=["hello"], max_new_tokens=200))

    asyncio.run(requests())
    assert looked == ["pydoc-gpt2"]


def test_unseen_files_are_looked_for_again_only_after_a_while(model_dir, monkeypatch, tmp_path):
    looked = _watched(monkeypatch)
    spec = load_registry(model_dir / "registry.yaml").get("pydoc-gpt2")
    spec = spec.model_copy(update={"path": tmp_path / "not-mounted-yet"})
    windows = ContextWindows()
    now = [1000.0]
    monkeypatch.setattr(context_window.time, "monotonic", lambda: now[0])

    async def request():
        await windows.fit(spec, TextGenerationInput(prompts=["hello"], max_new_tokens=500))

    asyncio.run(request())  # not measured here: the worker refuses what does not fit
    asyncio.run(request())
    assert looked == ["pydoc-gpt2"]
    now[0] += context_window.UNSEEN_RECHECK_SECONDS + 1
    asyncio.run(request())
    assert looked == ["pydoc-gpt2"] * 2
