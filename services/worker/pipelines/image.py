"""Image pipelines: Stable Diffusion, Stable Diffusion XL and class-conditional pixel DDPMs.

Batch invariance is the contract here: an item's image depends on its own fields only, never on
what it was batched with. So each item's starting noise (and any noise a scheduler draws later)
comes from a CPU generator seeded with the item's seed, drawn one item at a time, and moved to
the device afterwards; a CPU generator gives the same numbers on every machine, a GPU one does
not.
"""

import io
from collections.abc import Sequence

import numpy as np
import torch
from diffusers import (
    DDIMScheduler,
    DiffusionPipeline,
    StableDiffusionPipeline,
    StableDiffusionXLPipeline,
    UNet2DModel,
)
from PIL import Image

from services.worker.pipelines.base import ImageResult, Pipeline, ShouldStop
from services.worker.pipelines.stopped import PipelineStopped
from shared.class_prompts import resolve_class
from shared.subrequest import ImageItem


def _settings(items: Sequence[ImageItem]) -> tuple[int, int, int, float]:
    """The width, height, steps and guidance every item in a batch must share."""
    shared = {(i.width, i.height, i.steps, i.guidance_scale) for i in items}
    if len(shared) != 1:
        raise ValueError(f"items in one batch must share size, steps and guidance: {shared}")
    return shared.pop()


def _generators(items: Sequence[ImageItem]) -> list[torch.Generator]:
    return [torch.Generator(device="cpu").manual_seed(item.seed) for item in items]


def _noise(generators: list[torch.Generator], shape: tuple[int, ...]) -> torch.Tensor:
    # One draw per item, so an item's noise never depends on its place in the batch.
    return torch.cat([torch.randn((1, *shape), generator=g) for g in generators])


def _png(pixels: np.ndarray) -> bytes:
    """PNG bytes of a uint8 array: (H, W) gives a grayscale image, (H, W, 3) an RGB one."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _check_stop(should_stop: ShouldStop | None) -> None:
    if should_stop is not None and should_stop():
        raise PipelineStopped


class _LatentDiffusionPipeline(Pipeline):
    """Shared by SD and SDXL: load a diffusers pipeline, run it on per-item latents."""

    pipeline_class: type[DiffusionPipeline]
    pipe: DiffusionPipeline

    def setup(self) -> None:
        pipe = self.pipeline_class.from_pretrained(
            self.spec.path, dtype=self.dtype, local_files_only=True, **self._load_options()
        )
        pipe.set_progress_bar_config(disable=True)
        self.pipe = pipe.to(self.device)

    def _load_options(self) -> dict:
        return {}

    def _prompt_options(self, items: Sequence[ImageItem], guided: bool) -> dict:
        return {
            "prompt": [item.prompt for item in items],
            "negative_prompt": [item.negative_prompt for item in items] if guided else None,
        }

    def run(
        self, items: Sequence[ImageItem], should_stop: ShouldStop | None = None
    ) -> list[ImageResult]:
        if not items:
            return []
        width, height, steps, guidance = _settings(items)
        pipe = self.pipe
        scale = pipe.vae_scale_factor
        if width % scale or height % scale:
            raise ValueError(f"width and height must be multiples of {scale}")
        _check_stop(should_stop)
        generators = _generators(items)
        shape = (pipe.unet.config.in_channels, height // scale, width // scale)
        latents = _noise(generators, shape)

        def stop_between_steps(_pipe, _step, _timestep, _tensors) -> dict:
            _check_stop(should_stop)
            return {}

        with torch.inference_mode():
            images = pipe(
                **self._prompt_options(items, guided=guidance > 1),
                width=width,
                height=height,
                num_inference_steps=steps,
                guidance_scale=guidance,
                latents=latents.to(self.device, self.dtype),
                # Schedulers that add noise at each step draw it per item from these.
                generator=generators,
                output_type="pil",
                callback_on_step_end=stop_between_steps,
            ).images
        return [
            ImageResult(png=_png(np.asarray(image)), width=width, height=height, seed=item.seed)
            for image, item in zip(images, items, strict=True)
        ]


class StableDiffusionImagePipeline(_LatentDiffusionPipeline):
    pipeline_class = StableDiffusionPipeline


class StableDiffusionXLImagePipeline(_LatentDiffusionPipeline):
    pipeline_class = StableDiffusionXLPipeline

    def _load_options(self) -> dict:
        # The watermark would make outputs depend on an optional package being installed.
        return {"add_watermarker": False}

    def _prompt_options(self, items: Sequence[ImageItem], guided: bool) -> dict:
        pipe = self.pipe
        prompt, negative, pooled, negative_pooled = pipe.encode_prompt(
            prompt=[item.prompt for item in items],
            device=self.device,
            do_classifier_free_guidance=guided,
            negative_prompt=[item.negative_prompt for item in items] if guided else None,
        )
        if guided and pipe.config.force_zeros_for_empty_prompt:
            # SDXL's own rule for an empty negative prompt (zeros, not the encoded ""), applied
            # per item: the pipeline applies it only when the whole batch has none.
            empty = torch.tensor([not item.negative_prompt for item in items], device=self.device)
            negative = torch.where(empty[:, None, None], torch.zeros_like(negative), negative)
            negative_pooled = torch.where(
                empty[:, None], torch.zeros_like(negative_pooled), negative_pooled
            )
        return {
            "prompt_embeds": prompt,
            "negative_prompt_embeds": negative,
            "pooled_prompt_embeds": pooled,
            "negative_pooled_prompt_embeds": negative_pooled,
        }


class ClassDDPMImagePipeline(Pipeline):
    """A class-conditional pixel-space `UNet2DModel` with classifier-free guidance.

    The UNet's last class embedding is the "no class" one it was trained with (labels dropped
    at random), which gives the unconditional prediction guidance needs.
    """

    unet: UNet2DModel

    def setup(self) -> None:
        path = self.spec.path
        self.unet = UNet2DModel.from_pretrained(
            path, subfolder="unet", dtype=self.dtype, local_files_only=True
        ).to(self.device)
        self.unet.eval()
        # Trained as a 1000-step DDPM; DDIM samples the same model well in tens of steps and,
        # with no added noise, needs no randomness beyond the starting noise.
        self.scheduler_config = DDIMScheduler.load_config(
            path, subfolder="scheduler", local_files_only=True
        )
        self.null_class = self.unet.config.num_class_embeds - 1

    def _label(self, item: ImageItem) -> int:
        label = item.class_label
        if label is None:
            label = resolve_class(item.prompt, self.spec.classes)
        if not 0 <= label < self.null_class:
            raise ValueError(f"class label {label} out of range 0..{self.null_class - 1}")
        return label

    def run(
        self, items: Sequence[ImageItem], should_stop: ShouldStop | None = None
    ) -> list[ImageResult]:
        if not items:
            return []
        width, height, steps, guidance = _settings(items)
        size = self.unet.config.sample_size
        if (width, height) != (size, size):
            raise ValueError(f"this model makes {size}x{size} images, not {width}x{height}")
        labels = torch.tensor([self._label(item) for item in items], device=self.device)
        null = torch.full_like(labels, self.null_class)
        # A fresh scheduler per run: set_timesteps keeps state on the object.
        scheduler = DDIMScheduler.from_config(self.scheduler_config)
        scheduler.set_timesteps(steps, device=self.device)
        generators = _generators(items)
        channels = self.unet.config.in_channels
        sample = _noise(generators, (channels, height, width)).to(self.device, self.dtype)
        sample = sample * scheduler.init_noise_sigma
        with torch.inference_mode():
            for t in scheduler.timesteps:
                _check_stop(should_stop)
                eps = self._guided_eps(sample, t, labels, null, guidance)
                sample = scheduler.step(eps, t, sample, generator=generators).prev_sample
        pixels = ((sample.float() + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
        pixels = pixels.permute(0, 2, 3, 1).cpu().numpy()
        if channels == 1:
            pixels = pixels[..., 0]
        return [
            ImageResult(png=_png(image), width=width, height=height, seed=item.seed)
            for image, item in zip(pixels, items, strict=True)
        ]

    def _guided_eps(
        self,
        sample: torch.Tensor,
        t: torch.Tensor,
        labels: torch.Tensor,
        null: torch.Tensor,
        guidance: float,
    ) -> torch.Tensor:
        if guidance == 1:
            return self.unet(sample, t, class_labels=labels).sample
        both = self.unet(torch.cat([sample, sample]), t, class_labels=torch.cat([labels, null]))
        eps_cond, eps_uncond = both.sample.chunk(2)
        return eps_uncond + guidance * (eps_cond - eps_uncond)
