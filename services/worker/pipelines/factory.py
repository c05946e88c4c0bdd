"""Pick the pipeline class for a registry entry's kind."""

import torch

from services.worker.pipelines.base import Pipeline
from shared.registry import ModelKind, ModelSpec


def build_pipeline(spec: ModelSpec, device: torch.device) -> Pipeline:
    # Imported here so that a worker serving only text models never imports diffusers.
    if spec.kind == ModelKind.CAUSAL_LM:
        from services.worker.pipelines.text import CausalLMTextPipeline

        return CausalLMTextPipeline(spec, device)
    from services.worker.pipelines import image
    from services.worker.quiet import quiet_diffusers

    quiet_diffusers()

    classes = {
        ModelKind.STABLE_DIFFUSION: image.StableDiffusionImagePipeline,
        ModelKind.STABLE_DIFFUSION_XL: image.StableDiffusionXLImagePipeline,
        ModelKind.CLASS_DDPM: image.ClassDDPMImagePipeline,
    }
    return classes[spec.kind](spec, device)
