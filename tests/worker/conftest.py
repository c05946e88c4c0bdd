"""Models and loaded pipelines shared by the worker tests (built once per session, with their
graphs and buffer pools set up)."""

from pathlib import Path

import pytest
import torch

from modelbuild.digits import CLASSES
from services.worker.pipelines.image import (
    ClassDDPMImagePipeline,
    StableDiffusionImagePipeline,
    StableDiffusionXLImagePipeline,
)
from shared.registry import ModelSpec

DIGITS_DIR = Path(__file__).resolve().parents[2] / "models" / "digits"
CPU = torch.device("cpu")
# As in models/registry.yaml: the buffer pools are preallocated at these sizes.
TINY_DEFAULTS = {"width": 64, "height": 64, "steps": 4}


@pytest.fixture(scope="session")
def tiny_sd_dir(model_dir) -> Path:
    return model_dir / "tiny-sd"


@pytest.fixture(scope="session")
def tiny_sdxl_dir(model_dir) -> Path:
    return model_dir / "tiny-sdxl"


@pytest.fixture(scope="session")
def sd_pipeline(tiny_sd_dir) -> StableDiffusionImagePipeline:
    spec = ModelSpec(
        name="tiny-sd", kind="stable-diffusion", path=tiny_sd_dir, defaults=TINY_DEFAULTS
    )
    pipeline = StableDiffusionImagePipeline(spec, CPU)
    pipeline.setup()
    return pipeline


@pytest.fixture(scope="session")
def sdxl_pipeline(tiny_sdxl_dir) -> StableDiffusionXLImagePipeline:
    spec = ModelSpec(
        name="tiny-sdxl", kind="stable-diffusion-xl", path=tiny_sdxl_dir, defaults=TINY_DEFAULTS
    )
    pipeline = StableDiffusionXLImagePipeline(spec, CPU)
    pipeline.setup()
    return pipeline


@pytest.fixture(scope="session")
def digits_pipeline() -> ClassDDPMImagePipeline:
    spec = ModelSpec(
        name="digits",
        kind="class-ddpm",
        path=DIGITS_DIR,
        classes=CLASSES,
        defaults={"width": 16, "height": 16, "steps": 50, "guidance_scale": 2.0},
        max_batch=16,
        batch_invariant=True,  # as the registry ships it
    )
    pipeline = ClassDDPMImagePipeline(spec, CPU)
    pipeline.setup()
    return pipeline
