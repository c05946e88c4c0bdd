"""Pick the pipeline class for a registry entry's kind."""

import torch

from services.worker.pipelines.base import Pipeline
from shared.model_files import checked_folder
from shared.registry import ModelKind, ModelSpec


def build_pipeline(spec: ModelSpec, device: torch.device) -> Pipeline:
    """The pipeline of `spec`'s kind, given the model's own folder (a cache's snapshot
    resolved): the files are checked here, so that a missing one is named in a line rather
    than by whatever a library fails with."""
    spec = spec.model_copy(update={"path": checked_folder(spec), "hf_cache": None})
    # Imported here so that a worker serving only text models never imports diffusers.
    if spec.kind == ModelKind.CAUSAL_LM:
        from services.worker.pipelines.text import CausalLMTextPipeline

        return CausalLMTextPipeline(spec, device)
    from services.worker.pipelines import image
    from services.worker.quiet import quiet_diffusers

    quiet_diffusers()

    classes: dict[ModelKind, type[Pipeline]] = {
        ModelKind.STABLE_DIFFUSION: image.StableDiffusionImagePipeline,
        ModelKind.STABLE_DIFFUSION_XL: image.StableDiffusionXLImagePipeline,
        ModelKind.CLASS_DDPM: image.ClassDDPMImagePipeline,
    }
    return classes[spec.kind](spec, device)
