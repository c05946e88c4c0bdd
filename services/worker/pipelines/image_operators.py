"""The operators of the image pipelines: one graph, START to END, for every image model.

    START -> prepare -> encode -> denoise -> decode -> to_host -> SPLIT(png) -> collect -> END

- prepare (cpu): leases the batch's buffers, draws each item's starting noise from the item's
  own seeded CPU generator (one item at a time, so an item's noise never depends on its place
  in the batch) into pinned host memory, writes each item's guidance scale beside it, tokenises
  the prompts, and queues the host-to-device copies without waiting for them.
- encode (device): prompts through the text encoders, or class labels, into the conditioning
  the UNet takes; unconditional rows first when the batch is guided.
- denoise (device): a fresh scheduler per batch and the UNet, with classifier-free guidance
  at each item's own scale; the batch's stop hooks are polled before every step.
- decode (device): latents to pixels (VAE for latent models) and quantised to uint8 on the
  device, so only the final bytes cross to the host.
- to_host (device): the batch's one device-to-host copy and wait (`sync.to_host`).
- png (cpu, one per item) and collect (cpu): PNG bytes, then the results in item order.

The operators keep only read-only model state; everything of one batch travels in the
`ImageJob` that prepare makes and the later device operators fill in. Nothing here reads device
memory except through `sync.to_host`, and host data reaches the device only by non-blocking
copies from pinned memory, so on a CUDA device the host never waits for the GPU mid-batch.
"""

import inspect
import io
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from PIL import Image

from services.worker.engine import sync
from services.worker.engine.batch import Batch
from services.worker.engine.buffers import BucketKey, BufferPool, BufferSet
from services.worker.engine.graph import Graph
from services.worker.engine.operator import Operator
from services.worker.engine.results import ImageResult
from services.worker.engine.router import END, JOIN, START, Router, Split
from shared.messages import ImageItem


class DenoiseScheduler(Protocol):
    """What `Denoise` uses of a diffusers scheduler: every scheduler has these, though their
    common base class declares none of them."""

    timesteps: torch.Tensor
    init_noise_sigma: float

    def set_timesteps(self, num_inference_steps: int, device: str) -> None: ...

    def scale_model_input(self, sample: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor: ...

    def step(self, model_output: torch.Tensor, timestep: torch.Tensor, sample: torch.Tensor,
             *args: Any, **kwargs: Any) -> Any: ...


class ImageModel(Protocol):
    """What `Prepare` needs from the pipeline it serves."""

    device: torch.device
    pool: BufferPool

    def check_size(self, width: int, height: int) -> None: ...

    def bucket(self, n: int, width: int, height: int) -> BucketKey: ...

    def is_guided(self, guidance: float) -> bool: ...


@dataclass(eq=False)
class ImageJob:
    """One batch on its way through the image graph (made by prepare, filled in later)."""

    items: list[ImageItem]
    width: int
    height: int
    steps: int
    # Each item's guidance scale, (b, 1, 1, 1) float32 on the device: a batch may mix scales,
    # only whether guidance runs at all (`guided`) is the batch's.
    guidance: torch.Tensor
    guided: bool  # classifier-free guidance: two UNet rows per item
    buffers: BufferSet
    generators: list[torch.Generator]
    latents: torch.Tensor  # the starting noise on the device, then the denoised latents
    # Keyword arguments of the UNet call besides the sample and the timestep.
    conditioning: dict[str, Any] = field(default_factory=dict)
    uncond_first: bool = True  # the guided UNet rows' order: [uncond; cond] or [cond; uncond]
    pixels: torch.Tensor | None = None  # (b, H, W, C) uint8 on the device

    @property
    def size(self) -> int:
        return len(self.items)

    def halves(self) -> list[slice]:
        """The row ranges of the conditioning: [uncond, cond] when guided, else [cond]."""
        b = self.size
        return [slice(0, b), slice(b, 2 * b)] if self.guided else [slice(0, b)]

    @property
    def rows(self) -> int:
        return 2 * self.size if self.guided else self.size


def upload(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """Copy host memory into `dst` on the device without waiting (`src` pinned on CUDA)."""
    return dst.copy_(src, non_blocking=dst.device.type == "cuda")


def to_device(src: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A device copy of a small host tensor, through pinned memory, without waiting."""
    if device.type == "cpu":
        return src.clone()
    host = sync.pinned(tuple(src.shape), src.dtype, device)
    host.copy_(src)
    return upload(torch.empty(src.shape, dtype=src.dtype, device=device), host)


def noise_shape(buffers: BufferSet) -> tuple[int, ...]:
    return tuple(buffers["noise_host"].shape[1:])


def guidance_buffers(cap: int, device: torch.device) -> dict[str, torch.Tensor]:
    """A buffer set's per-item guidance scales: pinned host staging and its device copy."""
    return {
        "guidance_host": sync.pinned((cap,), torch.float32, device),
        "guidance": torch.empty((cap,), dtype=torch.float32, device=device),
    }


def guide(uncond: torch.Tensor, cond: torch.Tensor, guidance: torch.Tensor) -> torch.Tensor:
    """Classifier-free guidance, `uncond + g * (cond - uncond)`, with each item's scale.

    `guidance` is float32, so the product is taken in float32 and rounded once to the
    prediction's dtype: the numbers a Python float scale gives (PyTorch multiplies reduced
    precision tensors by a scalar in float32), whatever the batch holds.
    """
    return uncond + (guidance * (cond - uncond)).to(uncond.dtype)


class PromptTokenizer:
    """Tokenises prompts the way diffusers' encode_prompt does, into pinned buffers.

    Hugging Face fast tokenizers are not safe to call from two threads at once, and prepare
    runs on the shared CPU pool, so calls are serialised by a lock.
    """

    def __init__(
        self,
        tokenizers: Sequence[Any],
        convert: Callable[[list[str], Any], list[str]] | None = None,
        with_mask: bool = False,
    ) -> None:
        self.tokenizers = list(tokenizers)
        self.convert = convert  # textual inversion: multi-vector tokens
        self.with_mask = with_mask
        self._lock = threading.Lock()

    def __call__(self, texts: list[str], buffers: BufferSet) -> None:
        n = len(texts)
        with self._lock:
            for k, tokenizer in enumerate(self.tokenizers):
                batch_texts = self.convert(texts, tokenizer) if self.convert else texts
                encoded = tokenizer(
                    batch_texts,
                    padding="max_length",
                    max_length=tokenizer.model_max_length,
                    truncation=True,
                    return_tensors="pt",
                )
                buffers["ids_host"][k][:n].copy_(encoded.input_ids)
                if self.with_mask:
                    buffers["mask_host"][k][:n].copy_(encoded.attention_mask)
        for k in range(len(self.tokenizers)):
            upload(buffers["ids"][k][:n], buffers["ids_host"][k][:n])
            if self.with_mask:
                upload(buffers["mask"][k][:n], buffers["mask_host"][k][:n])


class Prepare(Operator):
    name = "prepare"
    input_type = list
    output_type = ImageJob
    executor = "cpu"

    def __init__(self, model: ImageModel, tokenize: PromptTokenizer | None = None) -> None:
        self.model = model
        self.tokenize = tokenize

    def run(self, items: list[ImageItem], batch: Batch) -> ImageJob:
        model = self.model
        first = items[0]
        width, height = first.width, first.height
        model.check_size(width, height)
        b = len(items)
        buffers = batch.hold(model.pool.lease(model.bucket(b, width, height)))
        generators = [torch.Generator(device="cpu").manual_seed(item.seed) for item in items]
        noise_host = buffers["noise_host"]
        shape = noise_shape(buffers)
        for i, generator in enumerate(generators):
            # One draw per item, exactly as a batch of one would draw it.
            noise_host[i].copy_(torch.randn((1, *shape), generator=generator)[0])
        latents = upload(buffers["latents"][:b], noise_host[:b])
        guidance_host = buffers["guidance_host"]
        guidance_host[:b].copy_(torch.tensor([item.guidance_scale for item in items]))
        guidance = upload(buffers["guidance"][:b], guidance_host[:b]).view(b, 1, 1, 1)
        job = ImageJob(
            items=list(items),
            width=width,
            height=height,
            steps=first.steps,
            guidance=guidance,
            # Equal for every item: the batch key holds it.
            guided=model.is_guided(first.guidance_scale),
            buffers=buffers,
            generators=generators,
            latents=latents,
        )
        if self.tokenize is not None:
            prompts = [item.prompt for item in items]
            negatives = [item.negative_prompt for item in items]
            self.tokenize([*negatives, *prompts] if job.guided else prompts, buffers)
        return job


class EncodePrompts(Operator):
    """Stable Diffusion: the text encoder's last hidden state, as StableDiffusionPipeline."""

    name = "encode"
    input_type = ImageJob
    output_type = ImageJob

    def __init__(self, text_encoder, use_mask: bool, guidance_embedding=None) -> None:
        self.text_encoder = text_encoder
        self.use_mask = use_mask
        # (each item's guidance scale, rows) -> (rows, dim) host tensor, the items' rows
        # repeated per half, for UNets conditioned on the guidance scale (LCM).
        self.guidance_embedding = guidance_embedding

    def run(self, job: ImageJob, batch: Batch) -> ImageJob:
        ids = job.buffers["ids"][0]
        embeds = job.buffers["embeds"]
        with torch.inference_mode():
            for rows in job.halves():  # one encoder call per half, as diffusers does
                mask = job.buffers["mask"][0][rows] if self.use_mask else None
                embeds[rows].copy_(self.text_encoder(ids[rows], attention_mask=mask)[0])
            job.conditioning = {"encoder_hidden_states": embeds[: job.rows]}
            if self.guidance_embedding is not None:
                scales = [item.guidance_scale for item in job.items]
                cond = self.guidance_embedding(scales, job.rows)
                job.conditioning["timestep_cond"] = to_device(cond, embeds.device).to(
                    job.latents.dtype
                )
        return job


class EncodePromptsXL(Operator):
    """Stable Diffusion XL: both encoders' penultimate hidden states side by side, the second
    encoder's pooled embedding and the size/crop ids, as StableDiffusionXLPipeline."""

    name = "encode"
    input_type = ImageJob
    output_type = ImageJob

    def __init__(self, text_encoders: Sequence[Any], zero_empty_negative: bool) -> None:
        self.text_encoders = list(text_encoders)
        self.zero_empty_negative = zero_empty_negative

    def run(self, job: ImageJob, batch: Batch) -> ImageJob:
        buffers = job.buffers
        embeds, pooled = buffers["embeds"], buffers["pooled"]
        with torch.inference_mode():
            for rows in job.halves():
                pooled_out = None
                offset = 0
                for k, encoder in enumerate(self.text_encoders):
                    out = encoder(buffers["ids"][k][rows], output_hidden_states=True)
                    # The pooled text is the first 2-d output: the projecting encoder's.
                    if pooled_out is None and out[0].ndim == 2:
                        pooled_out = out[0]
                    hidden = out.hidden_states[-2]
                    width = hidden.shape[-1]
                    embeds[rows, :, offset : offset + width].copy_(hidden)
                    offset += width
                pooled[rows].copy_(pooled_out)
            if job.guided and self.zero_empty_negative:
                # SDXL's rule for no negative prompt (zeros, not the encoded ""), per item: the
                # diffusers pipeline applies it only when the whole batch has none.
                for i, item in enumerate(job.items):
                    if not item.negative_prompt:
                        embeds[i].zero_()
                        pooled[i].zero_()
            n = job.rows
            job.conditioning = {
                "encoder_hidden_states": embeds[:n],
                "added_cond_kwargs": {
                    "text_embeds": pooled[:n],
                    "time_ids": buffers["time_ids"][:n],
                },
            }
        return job


class EncodeClassLabels(Operator):
    """Class-conditional models: each item's class, plus the "no class" label when guided."""

    name = "encode"
    input_type = ImageJob
    output_type = ImageJob

    def __init__(self, label: Callable[[ImageItem], int], null_class: int) -> None:
        self.label = label
        self.null_class = null_class

    def run(self, job: ImageJob, batch: Batch) -> ImageJob:
        b = job.size
        host = job.buffers["labels_host"]
        host[:b].copy_(torch.tensor([self.label(item) for item in job.items]))
        if job.guided:
            host[b : 2 * b].fill_(self.null_class)
        labels = upload(job.buffers["labels"][: job.rows], host[: job.rows])
        job.conditioning = {"class_labels": labels}
        job.uncond_first = False  # [labels; null], as this model has always been sampled
        return job


def step_kwargs(scheduler: DenoiseScheduler, generators: list[torch.Generator]) -> dict:
    """What diffusers' prepare_extra_step_kwargs passes to `step` (eta 0, per-item noise)."""
    accepted = inspect.signature(scheduler.step).parameters
    kwargs: dict[str, Any] = {}
    if "eta" in accepted:
        kwargs["eta"] = 0.0
    if "generator" in accepted:
        kwargs["generator"] = generators
    return kwargs


class Denoise(Operator):
    """The sampling loop over a fresh scheduler, with classifier-free guidance."""

    name = "denoise"
    input_type = ImageJob
    output_type = ImageJob

    def __init__(self, unet, new_scheduler: Callable[[], DenoiseScheduler]) -> None:
        self.unet = unet
        self.new_scheduler = new_scheduler  # set_timesteps keeps state on the object

    def run(self, job: ImageJob, batch: Batch) -> ImageJob:
        scheduler = self.new_scheduler()
        # Timesteps stay on the host for the scheduler's own arithmetic (indexing its tables
        # with a device tensor would make the host wait); the UNet gets a device copy.
        scheduler.set_timesteps(job.steps, device="cpu")
        if hasattr(scheduler, "set_begin_index"):
            scheduler.set_begin_index(0)
        timesteps = scheduler.timesteps
        device_timesteps = to_device(timesteps, job.latents.device)
        extra = step_kwargs(scheduler, job.generators)
        with torch.inference_mode():
            latents = job.latents.mul_(scheduler.init_noise_sigma)
            for i, t in enumerate(timesteps):
                batch.check_stops()
                model_input = torch.cat([latents] * 2) if job.guided else latents
                model_input = scheduler.scale_model_input(model_input, t)
                out = self.unet(
                    model_input, device_timesteps[i], **job.conditioning, return_dict=False
                )[0]
                if job.guided:
                    first, second = out.chunk(2)
                    uncond, cond = (first, second) if job.uncond_first else (second, first)
                    out = guide(uncond, cond, job.guidance)
                latents = scheduler.step(out, t, latents, **extra, return_dict=False)[0]
        job.latents = latents
        return job


class VaeDecode(Operator):
    """Latents through the VAE, then quantised on the device as diffusers' image processor
    would: (x / 2 + 0.5).clamp(0, 1) * 255, rounded."""

    name = "decode"
    input_type = ImageJob
    output_type = ImageJob

    def __init__(
        self,
        vae,
        scaling_factor: float,
        latents_mean: torch.Tensor | None = None,
        latents_std: torch.Tensor | None = None,
    ) -> None:
        self.vae = vae
        self.scaling_factor = scaling_factor
        self.latents_mean = latents_mean
        self.latents_std = latents_std

    def run(self, job: ImageJob, batch: Batch) -> ImageJob:
        with torch.inference_mode():
            latents = job.latents.to(self.vae.dtype)
            if self.latents_mean is not None and self.latents_std is not None:
                latents = latents * self.latents_std / self.scaling_factor + self.latents_mean
            else:
                latents = latents / self.scaling_factor
            image = self.vae.decode(latents, return_dict=False)[0]
            pixels = ((image.float() / 2 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8)
            job.pixels = pixels.permute(0, 2, 3, 1).contiguous()
        return job


class PixelDecode(Operator):
    """Pixel-space models: the sample in [-1, 1] straight to uint8."""

    name = "decode"
    input_type = ImageJob
    output_type = ImageJob

    def run(self, job: ImageJob, batch: Batch) -> ImageJob:
        with torch.inference_mode():
            pixels = ((job.latents.float() + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
            job.pixels = pixels.permute(0, 2, 3, 1).contiguous()
        return job


class ToHost(Operator):
    """The batch's one device-to-host copy; returns one (H, W[, C]) uint8 array per item.

    The arrays are views of the leased pinned buffer, valid until the batch ends (png and
    collect run before that).
    """

    name = "to_host"
    input_type = ImageJob
    output_type = list

    def __init__(self, model: str) -> None:
        self.model = model

    def run(self, job: ImageJob, batch: Batch) -> list[np.ndarray]:
        assert job.pixels is not None, "decode runs before to_host"
        staging = job.buffers["pixels_host"][: job.size]
        host = sync.to_host(job.pixels, staging=staging, model=self.model).numpy()
        if host.shape[-1] == 1:
            host = host[..., 0]  # one channel: a grayscale image
        return list(host)


class EncodePng(Operator):
    name = "png"
    input_type = np.ndarray
    output_type = bytes
    executor = "cpu"

    def run(self, pixels: np.ndarray, batch: Batch) -> bytes:
        """(H, W) gives a grayscale PNG, (H, W, 3) an RGB one."""
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG")
        return buffer.getvalue()


class Collect(Operator):
    name = "collect"
    input_type = list
    output_type = list
    executor = "cpu"

    def run(self, pngs: list[bytes], batch: Batch) -> list[ImageResult]:
        return [
            ImageResult(png=png, width=item.width, height=item.height, seed=item.seed)
            for png, item in zip(pngs, batch.items, strict=True)
        ]


def image_graph(
    prepare: Operator, encode: Operator, denoise: Operator, decode: Operator, model: str
) -> Graph:
    """The image graph; models differ only in their prepare, encode, denoise and decode."""
    operators = [prepare, encode, denoise, decode, ToHost(model), EncodePng(), Collect()]
    router = Router(
        {
            START: "prepare",
            "prepare": "encode",
            "encode": "denoise",
            "denoise": "decode",
            "decode": "to_host",
            "to_host": Split(each="png", then="collect"),
            "png": JOIN,
            "collect": END,
        }
    )
    return Graph(operators, router)
