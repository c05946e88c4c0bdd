"""Image pipelines: Stable Diffusion, Stable Diffusion XL and class-conditional pixel DDPMs.

Each is the same operator graph (`image_operators.py`): prepare -> encode -> denoise -> decode
-> to_host -> png per item -> collect. The models differ in their encode operator (text
encoders, or class labels) and their decode (a VAE, or none for pixel-space models).

Batch invariance is the contract here: an item's image depends on its own fields only, never on
what it was batched with. So each item's starting noise (and any noise a scheduler draws later)
comes from a CPU generator seeded with the item's seed, drawn one item at a time, and moved to
the device afterwards; a CPU generator gives the same numbers on every machine, a GPU one does
not.

Items batch together when their tensors have the same shapes: equal size and steps, and
either all or none running classifier-free guidance. The guidance scale itself is per item (a
tensor in the denoise step, and in the guidance embedding of UNets conditioned on it).

Buffers are leased per batch from the pipeline's pool, bucketed by (capacity, latent height,
latent width): the starting latents on the device, pinned host staging for the noise, the
guidance scales and the final uint8 pixels, token ids and the text embeddings.
"""

from collections.abc import Hashable, Sequence
from typing import Any

import torch

# From their own modules: the package's lazy `__init__` shows the checker placeholder classes
# with no attributes.
from diffusers.models.unets.unet_2d import UNet2DModel
from diffusers.pipelines.pipeline_utils import DiffusionPipeline
from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import (
    StableDiffusionPipeline,
)
from diffusers.pipelines.stable_diffusion_xl.pipeline_stable_diffusion_xl import (
    StableDiffusionXLPipeline,
)
from diffusers.schedulers.scheduling_ddim import DDIMScheduler, DDIMSchedulerOutput

from services.worker.engine import sync
from services.worker.engine.buffers import BucketKey, capacity
from services.worker.engine.graph import Graph
from services.worker.engine.operator import Operator
from services.worker.pipelines.base import GraphPipeline
from services.worker.pipelines.batch_invariant import make_batch_invariant
from services.worker.pipelines.image_operators import (
    Denoise,
    EncodeClassLabels,
    EncodePrompts,
    EncodePromptsXL,
    PixelDecode,
    Prepare,
    PromptTokenizer,
    VaeDecode,
    guidance_buffers,
    image_graph,
    to_device,
)
from shared.class_prompts import resolve_class
from shared.messages import ImageItem


class _ImagePipeline(GraphPipeline):
    """What the image pipelines share: batch keys, pool buckets and the graph's shape."""

    def batch_key(self, item: ImageItem) -> Hashable:
        # What changes tensor shapes only: the guidance scale is per item, but whether guidance
        # runs at all doubles the UNet's rows. Prompts, negative prompts, class labels and
        # seeds are per item too.
        return (item.width, item.height, item.steps, self.is_guided(item.guidance_scale))

    def _setup(self) -> None:
        self.load()
        if self.spec.batch_invariant:
            for model in self.models():
                make_batch_invariant(model)
        self.prepare()

    def models(self) -> list[torch.nn.Module]:
        """The loaded networks an image runs through."""
        raise NotImplementedError

    def check_size(self, width: int, height: int) -> None:
        """Raise ValueError for an image size this model cannot make."""
        raise NotImplementedError

    def bucket(self, n: int, width: int, height: int) -> BucketKey:
        """The buffer bucket of a batch of `n` images of this size."""
        raise NotImplementedError

    def is_guided(self, guidance: float) -> bool:
        """Whether an item with this guidance scale runs classifier-free guidance."""
        raise NotImplementedError

    def pool_buckets(self) -> list[BucketKey]:
        """Capacities 1, 2, 4, ... up to the largest batch, at the model's default size."""
        width, height = self.spec.defaults.width, self.spec.defaults.height
        try:
            self.check_size(width, height)
        except ValueError:
            return []  # a default this model cannot make: every batch leases ad hoc
        top = capacity(self.spec.max_batch)
        return [self.bucket(1 << k, width, height) for k in range(top.bit_length())]

    def _graph(self, prepare: Operator, encode: Operator, decode: Operator, unet, scheduler):
        return image_graph(prepare, encode, Denoise(unet, scheduler), decode, self.spec.name)


class _LatentDiffusionPipeline(_ImagePipeline):
    """Shared by SD and SDXL: a diffusers pipeline's components, run as operators."""

    pipeline_class: type[DiffusionPipeline]
    pipe: DiffusionPipeline  # the loaded diffusers pipeline (also a reference in tests)

    def load(self) -> None:
        pipe = self.pipeline_class.from_pretrained(
            self.spec.path, dtype=self.dtype, local_files_only=True, **self._load_options()
        )
        pipe.set_progress_bar_config(disable=True)
        self.pipe = pipe.to(self.device)
        self.scale = pipe.vae_scale_factor
        self.decoder = self._decoder()

    def models(self) -> list[torch.nn.Module]:
        return [c for c in self.pipe.components.values() if isinstance(c, torch.nn.Module)]

    def _load_options(self) -> dict:
        return {}

    def _decoder(self) -> VaeDecode:
        """The decode operator, decoding as this model's diffusers pipeline does."""
        return VaeDecode(self.pipe.vae, self.pipe.vae.config.scaling_factor)

    def _new_scheduler(self):
        # A fresh scheduler per batch: set_timesteps keeps state on the object.
        scheduler = self.pipe.scheduler
        return type(scheduler).from_config(scheduler.config)

    def _encoders(self) -> list[tuple[Any, Any]]:
        """(tokenizer, text encoder) pairs, in the order their embeddings are concatenated."""
        raise NotImplementedError

    def check_size(self, width: int, height: int) -> None:
        if width % self.scale or height % self.scale:
            raise ValueError(f"width and height must be multiples of {self.scale}")

    def bucket(self, n: int, width: int, height: int) -> BucketKey:
        return (capacity(n), height // self.scale, width // self.scale)

    def is_guided(self, guidance: float) -> bool:
        return guidance > 1 and self.pipe.unet.config.time_cond_proj_dim is None

    def allocate(self, key: BucketKey) -> dict[str, Any]:
        cap, latent_h, latent_w = key
        pipe = self.pipe
        device = self.device
        channels = pipe.unet.config.in_channels
        latents = (cap, channels, latent_h, latent_w)
        pixels = (cap, latent_h * self.scale, latent_w * self.scale, pipe.vae.config.out_channels)
        buffers: dict[str, Any] = {
            "latents": torch.empty(latents, dtype=self.dtype, device=device),
            # The noise is drawn in float32 and cast to the model's dtype on the host, so
            # the copy to the device is a plain DMA.
            "noise_host": sync.pinned(latents, self.dtype, device),
            "pixels_host": sync.pinned(pixels, torch.uint8, device),
            **guidance_buffers(cap, device),
            "ids_host": [],
            "ids": [],
        }
        # Token ids (2 * capacity rows: the negative prompts and the prompts).
        for tokenizer, _ in self._encoders():
            shape = (2 * cap, tokenizer.model_max_length)
            buffers["ids_host"].append(sync.pinned(shape, torch.long, device))
            buffers["ids"].append(torch.empty(shape, dtype=torch.long, device=device))
        return buffers


class StableDiffusionImagePipeline(_LatentDiffusionPipeline):
    pipeline_class = StableDiffusionPipeline

    def _load_options(self) -> dict:
        # The graph never runs a safety checker, so its weights are not loaded.
        return {"safety_checker": None, "requires_safety_checker": False}

    def _encoders(self) -> list[tuple[Any, Any]]:
        return [(self.pipe.tokenizer, self.pipe.text_encoder)]

    def _use_mask(self) -> bool:
        return bool(getattr(self.pipe.text_encoder.config, "use_attention_mask", False))

    def build_graph(self) -> Graph:
        pipe = self.pipe
        tokenize = PromptTokenizer(
            [pipe.tokenizer], pipe.maybe_convert_prompt, with_mask=self._use_mask()
        )
        guidance_embedding = None
        if pipe.unet.config.time_cond_proj_dim is not None:
            dim = pipe.unet.config.time_cond_proj_dim

            def guidance_embedding(guidance: Sequence[float], rows: int) -> torch.Tensor:
                # One item at a time, so an item's embedding is the same in any batch.
                per_item = [
                    pipe.get_guidance_scale_embedding(torch.tensor([g - 1]), embedding_dim=dim)
                    for g in guidance
                ]
                return torch.cat(per_item).repeat(rows // len(per_item), 1)

        encode = EncodePrompts(pipe.text_encoder, self._use_mask(), guidance_embedding)
        return self._graph(
            Prepare(self, tokenize), encode, self.decoder, pipe.unet, self._new_scheduler
        )

    def allocate(self, key: BucketKey) -> dict[str, Any]:
        buffers = super().allocate(key)
        cap = key[0]
        encoder = self.pipe.text_encoder
        length = self.pipe.tokenizer.model_max_length
        shape = (2 * cap, length, encoder.config.hidden_size)
        buffers["embeds"] = torch.empty(shape, dtype=encoder.dtype, device=self.device)
        if self._use_mask():
            mask = (2 * cap, length)
            buffers["mask_host"] = [sync.pinned(mask, torch.long, self.device)]
            buffers["mask"] = [torch.empty(mask, dtype=torch.long, device=self.device)]
        return buffers


class StableDiffusionXLImagePipeline(_LatentDiffusionPipeline):
    pipeline_class = StableDiffusionXLPipeline

    def _load_options(self) -> dict:
        # The watermark would make outputs depend on an optional package being installed.
        return {"add_watermarker": False}

    def _decoder(self) -> VaeDecode:
        # As StableDiffusionXLPipeline: a VAE that overflows in float16 decodes in float32, and
        # latents are de-normalised with the VAE's mean and std when its config has them.
        vae = self.pipe.vae
        config = vae.config
        if vae.dtype == torch.float16 and getattr(config, "force_upcast", False):
            # A float32 copy loaded once (diffusers casts the shared VAE to float32 and back
            # around every decode instead).
            fp32 = type(vae).from_pretrained(
                self.spec.path, subfolder="vae", dtype=torch.float32, local_files_only=True
            )
            vae = fp32.to(self.device)
        mean = getattr(config, "latents_mean", None)
        std = getattr(config, "latents_std", None)
        if mean is None or std is None:
            return VaeDecode(vae, config.scaling_factor)

        def stat(values) -> torch.Tensor:
            return torch.tensor(values).view(1, -1, 1, 1).to(self.device, vae.dtype)

        return VaeDecode(vae, config.scaling_factor, stat(mean), stat(std))

    def _encoders(self) -> list[tuple[Any, Any]]:
        pipe = self.pipe
        pairs = [(pipe.tokenizer, pipe.text_encoder), (pipe.tokenizer_2, pipe.text_encoder_2)]
        return [(t, e) for t, e in pairs if t is not None and e is not None]

    def build_graph(self) -> Graph:
        pipe = self.pipe
        encoders = self._encoders()
        tokenize = PromptTokenizer([t for t, _ in encoders], pipe.maybe_convert_prompt)
        encode = EncodePromptsXL(
            [e for _, e in encoders], bool(pipe.config["force_zeros_for_empty_prompt"])
        )
        return self._graph(
            Prepare(self, tokenize), encode, self.decoder, pipe.unet, self._new_scheduler
        )

    def allocate(self, key: BucketKey) -> dict[str, Any]:
        buffers = super().allocate(key)
        cap, latent_h, latent_w = key
        pipe = self.pipe
        encoders = self._encoders()
        projecting = pipe.text_encoder_2
        dtype = projecting.dtype
        length = encoders[0][0].model_max_length
        width = sum(e.config.hidden_size for _, e in encoders)
        rows = 2 * cap
        buffers["embeds"] = torch.empty((rows, length, width), dtype=dtype, device=self.device)
        projection = projecting.config.projection_dim
        buffers["pooled"] = torch.empty((rows, projection), dtype=dtype, device=self.device)
        # The size and crop ids are the same for every image of a bucket: filled in once.
        size = (latent_h * self.scale, latent_w * self.scale)
        time_ids = pipe._get_add_time_ids(
            size, (0, 0), size, dtype=dtype, text_encoder_projection_dim=projection
        )
        buffers["time_ids"] = to_device(time_ids.repeat(rows, 1), self.device)
        return buffers


class NextTimestepDDIMScheduler(DDIMScheduler):
    """diffusers' DDIM, stepping to the schedule's own next timestep, with a noise estimate that
    matches the clipped clean-image estimate.

    `DDIMScheduler.step` steps from t to t - num_train_timesteps // steps, which under "trailing"
    or "linspace" spacing is the next timestep only when the step count divides
    num_train_timesteps: at 400 of 1000 steps every other step lands one noise level off the
    next one, and the noise left over shows as speckle. And where it clips the clean-image
    estimate it still steps with the unclipped noise estimate, which moves the sample by the
    clipped amount every step, however small the step. Deterministic steps (eta 0) only, as
    `Denoise` runs them; otherwise the arithmetic is diffusers', so outputs are the same
    wherever neither applies.
    """

    def step(self, model_output: torch.Tensor, timestep: int, sample: torch.Tensor,
             eta: float = 0.0, use_clipped_model_output: bool = False,
             generator: torch.Generator | None = None, variance_noise: torch.Tensor | None = None,
             return_dict: bool = True) -> DDIMSchedulerOutput | tuple:
        # The noise estimate always matches the clipped estimate, and with eta 0 no variance
        # noise is drawn: `use_clipped_model_output` and `variance_noise` change nothing here.
        if eta:
            raise ValueError("NextTimestepDDIMScheduler takes deterministic steps only (eta 0)")
        schedule = self.timesteps.tolist()
        at = schedule.index(int(timestep))
        prev = schedule[at + 1] if at + 1 < len(schedule) else -1
        alpha = self.alphas_cumprod[int(timestep)]
        alpha_prev = self.alphas_cumprod[prev] if prev >= 0 else self.final_alpha_cumprod
        signal, noise = alpha**0.5, (1 - alpha) ** 0.5
        kind = self.config["prediction_type"]
        if kind == "epsilon":
            x0, eps = (sample - noise * model_output) / signal, model_output
        elif kind == "v_prediction":
            x0 = signal * sample - noise * model_output
            eps = signal * model_output + noise * sample
        elif kind == "sample":
            x0 = model_output
            eps = (sample - signal * x0) / noise
        else:
            raise ValueError(f"unknown prediction_type {kind!r}")
        if self.config["thresholding"] or self.config["clip_sample"]:
            if self.config["thresholding"]:
                x0 = self._threshold_sample(x0)
            else:
                x0 = x0.clamp(-self.config["clip_sample_range"], self.config["clip_sample_range"])
            eps = (sample - signal * x0) / noise
        prev_sample = alpha_prev**0.5 * x0 + (1 - alpha_prev) ** 0.5 * eps
        if not return_dict:
            return (prev_sample, x0)
        return DDIMSchedulerOutput(prev_sample=prev_sample, pred_original_sample=x0)


class ClassDDPMImagePipeline(_ImagePipeline):
    """A class-conditional pixel-space `UNet2DModel` with classifier-free guidance.

    The UNet's last class embedding is the "no class" one it was trained with (labels dropped
    at random), which gives the unconditional prediction guidance needs.
    """

    unet: UNet2DModel

    def load(self) -> None:
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
        self.null_class = self.unet.config["num_class_embeds"] - 1

    def models(self) -> list[torch.nn.Module]:
        return [self.unet]

    def build_graph(self) -> Graph:
        return self._graph(
            Prepare(self),
            EncodeClassLabels(self._label, self.null_class),
            PixelDecode(),
            self.unet,
            lambda: NextTimestepDDIMScheduler.from_config(self.scheduler_config),
        )

    def _label(self, item: ImageItem) -> int:
        label = item.class_label
        if label is None:
            label = resolve_class(item.prompt, self.spec.classes)
        if not 0 <= label < self.null_class:
            raise ValueError(f"class label {label} out of range 0..{self.null_class - 1}")
        return label

    def check_size(self, width: int, height: int) -> None:
        size = self.unet.config["sample_size"]
        if (width, height) != (size, size):
            raise ValueError(f"this model makes {size}x{size} images, not {width}x{height}")

    def bucket(self, n: int, width: int, height: int) -> BucketKey:
        return (capacity(n), height, width)

    def is_guided(self, guidance: float) -> bool:
        return guidance != 1

    def pool_buckets(self) -> list[BucketKey]:
        # The model makes one size only, whatever the registry's defaults say.
        size = self.unet.config["sample_size"]
        top = capacity(self.spec.max_batch)
        return [self.bucket(1 << k, size, size) for k in range(top.bit_length())]

    def allocate(self, key: BucketKey) -> dict[str, Any]:
        cap, height, width = key
        device = self.device
        channels = self.unet.config["in_channels"]
        shape = (cap, channels, height, width)
        out = (cap, height, width, self.unet.config["out_channels"])
        return {
            "latents": torch.empty(shape, dtype=self.dtype, device=device),
            "noise_host": sync.pinned(shape, self.dtype, device),
            "pixels_host": sync.pinned(out, torch.uint8, device),
            "labels_host": sync.pinned((2 * cap,), torch.long, device),
            "labels": torch.empty((2 * cap,), dtype=torch.long, device=device),
            **guidance_buffers(cap, device),
        }
