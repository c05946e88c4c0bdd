"""A registry entry whose model folder, or a file in it, is missing is named as such in one
line, before any library reads the folder name as a model hub id and fails with something
unrelated."""

import shutil
from pathlib import Path

import pytest
import torch

from services.worker.pipelines.factory import build_pipeline
from shared.errors import ModelFilesMissing
from shared.registry import ModelKind, ModelSpec


@pytest.mark.parametrize("kind", [ModelKind.STABLE_DIFFUSION, ModelKind.CAUSAL_LM])
def test_a_missing_model_folder_is_named_with_the_way_to_build_it(tmp_path: Path, kind):
    spec = ModelSpec(name="tiny-sd", kind=kind, path=tmp_path / "tiny-sd")
    with pytest.raises(ModelFilesMissing) as caught:
        build_pipeline(spec, torch.device("cpu"))
    assert str(tmp_path / "tiny-sd") in str(caught.value)
    assert "make models" in str(caught.value)


@pytest.mark.parametrize(("remove", "named"), [
    ("config.json", "config.json"),
    ("model.safetensors", "weights"),
    ("tokenizer.json", "a tokenizer (tokenizer.json)"),
])
def test_a_text_model_missing_a_file_names_the_folder_and_the_file(model_dir: Path,
                                                                   tmp_path: Path, remove, named):
    folder = tmp_path / "tiny-gpt2"
    shutil.copytree(model_dir / "tiny-gpt2", folder)
    (folder / remove).unlink()
    spec = ModelSpec(name="tiny-gpt2", kind=ModelKind.CAUSAL_LM, path=folder)
    with pytest.raises(ModelFilesMissing) as caught:
        build_pipeline(spec, torch.device("cpu"))
    line = str(caught.value)
    assert line.startswith(f"model tiny-gpt2: {folder} lacks ") and named in line
    assert "\n" not in line


def test_a_cache_without_the_snapshot_asked_for_is_named(hub_cache: Path):
    spec = ModelSpec(name="tiny-chat", kind=ModelKind.CAUSAL_LM, path="fibermill/tiny-chat",
                     hf_cache=hub_cache, revision="v9")
    with pytest.raises(ModelFilesMissing, match="models--fibermill--tiny-chat: no snapshot"):
        build_pipeline(spec, torch.device("cpu"))
