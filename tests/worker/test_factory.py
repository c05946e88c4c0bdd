"""A registry entry whose model folder is missing is named as such, before any library reads
the folder name as a model hub id and fails with something unrelated."""

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
