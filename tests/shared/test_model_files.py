"""A model's files read without torch: its folder (plain, or a Hugging Face cache's snapshot),
its context length, its chat template, and what a folder lacks, said in one line."""

import json
from pathlib import Path

import pytest
import yaml

from shared import model_files
from shared.errors import ModelFilesMissing, ModelNotLoadable
from shared.registry import ModelKind, ModelRegistry, ModelSpec
from tests.hub_cache import COMMIT, write_hub_cache


def _text_model(folder: Path, config: dict | None = None, **files: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"n_positions": 256} if config is None
                                                   else config))
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "tokenizer.json").write_text("{}")
    for name, text in files.items():
        (folder / name.replace("_json", ".json").replace("_jinja", ".jinja")).write_text(text)
    return folder


def _spec(path, **extra) -> ModelSpec:
    return ModelSpec(name="m", kind=ModelKind.CAUSAL_LM, path=path, **extra)


def test_a_repo_id_in_a_cache_and_the_cache_folder_resolve_to_the_snapshot(tmp_path):
    repo = write_hub_cache(_text_model(tmp_path / "src"), tmp_path / "hf", "org/tiny")
    snapshot = repo / "snapshots" / COMMIT
    assert model_files.model_folder(_spec("org/tiny", hf_cache=tmp_path / "hf")) == snapshot
    assert model_files.model_folder(_spec(repo)) == snapshot
    assert model_files.model_folder(_spec(repo, revision=COMMIT)) == snapshot
    assert model_files.context_length(_spec(repo)) == 256


def test_a_revision_the_cache_lacks_is_named(tmp_path):
    repo = write_hub_cache(_text_model(tmp_path / "src"), tmp_path / "hf", "org/tiny")
    with pytest.raises(ModelFilesMissing) as missing:
        model_files.model_folder(_spec(repo, revision="v2"))
    said = str(missing.value)
    assert said.startswith("model m: ") and str(repo) in said and "refs/v2" in said
    assert "\n" not in said


def test_the_registry_reads_a_repo_id_and_a_cache_relative_to_itself(tmp_path):
    (tmp_path / "registry.yaml").write_text(yaml.safe_dump({"models": {"chat": {
        "kind": "causal-lm", "path": "org/tiny", "hf_cache": "hf", "max_context": 64}}}))
    spec = ModelRegistry.load(tmp_path / "registry.yaml").get("chat")
    assert spec.path == Path("org/tiny") and spec.hf_cache == tmp_path / "hf"
    assert (spec.revision, spec.max_context) == ("main", 64)
    with pytest.raises(ValueError, match="repo id"):
        _spec("/models/tiny", hf_cache=tmp_path)
    # A repo id without an organisation, as the hub's oldest models have.
    repo = write_hub_cache(_text_model(tmp_path / "src"), tmp_path / "hf", "gpt2")
    assert repo.name == "models--gpt2"
    assert model_files.model_folder(_spec("gpt2", hf_cache=tmp_path / "hf")) == \
        repo / "snapshots" / COMMIT


@pytest.mark.parametrize(("config", "context"), [
    ({"n_positions": 1024}, 1024),
    ({"max_position_embeddings": 32768, "n_positions": 7}, 32768),
    ({"max_sequence_length": 512}, 512),
    ({"text_config": {"max_position_embeddings": 4096}}, 4096),
    ({}, model_files.DEFAULT_CONTEXT),
])
def test_the_context_is_the_configs_own(tmp_path, config, context):
    assert model_files.context_length(_spec(_text_model(tmp_path / "m", config))) == context


def test_the_registrys_max_context_wins_and_image_or_unseen_models_have_none(tmp_path):
    folder = _text_model(tmp_path / "m")
    assert model_files.context_length(_spec(folder, max_context=100)) == 100
    assert model_files.context_length(_spec(tmp_path / "elsewhere")) is None
    image = ModelSpec(name="sd", kind=ModelKind.STABLE_DIFFUSION, path=folder)
    assert model_files.context_length(image) is None


def test_the_chat_template_is_the_registrys_else_the_tokenizers(tmp_path):
    jinja = _text_model(tmp_path / "a", chat_template_jinja="{{ 'jinja' }}")
    config = _text_model(tmp_path / "b", tokenizer_config_json=json.dumps(
        {"chat_template": "{{ 'config' }}", "bos_token": {"content": "<s>"}}))
    named = _text_model(tmp_path / "c", tokenizer_config_json=json.dumps({"chat_template": [
        {"name": "tool_use", "template": "tools"}, {"name": "default", "template": "plain"}]}))
    assert model_files.chat_template(_spec(jinja)) == "{{ 'jinja' }}"
    assert model_files.chat_template(_spec(config)) == "{{ 'config' }}"
    assert model_files.special_tokens(_spec(config)) == {"bos_token": "<s>"}
    assert model_files.chat_template(_spec(named)) == "plain"
    assert model_files.chat_template(_spec(jinja, chat_template="own")) == "own"
    assert model_files.chat_template(_spec(_text_model(tmp_path / "d"))) is None


@pytest.mark.parametrize(("remove", "said"), [
    ("config.json", "config.json"),
    ("model.safetensors", "weights (model.safetensors or "),
    ("tokenizer.json", "a tokenizer (tokenizer.json)"),
])
def test_a_folder_missing_a_file_is_named_in_one_line(tmp_path, remove, said):
    folder = _text_model(tmp_path / "m")
    (folder / remove).unlink()
    with pytest.raises(ModelFilesMissing) as missing:
        model_files.checked_folder(_spec(folder))
    line = str(missing.value)
    assert line.startswith(f"model m: {folder} lacks ") and said in line and "\n" not in line


def test_everything_missing_is_named_at_once(tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    with pytest.raises(ModelFilesMissing) as missing:
        model_files.checked_folder(_spec(folder))
    assert str(missing.value).count(", ") >= 2  # config, weights and tokenizer


def test_a_max_context_above_the_models_positions_cannot_load(tmp_path):
    folder = _text_model(tmp_path / "m")
    assert model_files.checked_folder(_spec(folder, max_context=256)) == folder
    with pytest.raises(ModelNotLoadable, match="max_context 300 is above the 256 positions"):
        model_files.checked_folder(_spec(folder, max_context=300))
