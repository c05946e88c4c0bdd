"""Pick the pipeline class for a registry entry's kind."""

import torch

from services.worker.pipelines.base import Pipeline
from shared.errors import ModelFilesMissing
from shared.registry import ModelKind, ModelSpec


def build_pipeline(spec: ModelSpec, device: torch.device) -> Pipeline:
    if not spec.path.is_dir():
        # Said before any library tries the folder name as a model hub id.
        raise ModelFilesMissing(
            f"model {spec.name}: {spec.path} does not exist (the registry's `path`); "
            "`make models` builds the demo and test models")
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
