"""`make bench-gpu`: the image engine against diffusers' own pipeline on a CUDA device.

    python -m benchmarks.gpu [--shape sd15|tiny] [--batch 8] [--steps 25]

No weights can be downloaded, so the model has Stable Diffusion 1.5's shapes (UNet, VAE, CLIP
text encoder) with random weights: the work per step is the real one, the images are noise.
For the same batch, seeds and starting latents it reports:
- time per batch, Fibermill's operator graph vs `StableDiffusionPipeline.__call__` (goal: our
  throughput >= 0.9x the reference), and the largest pixel difference between the two;
- device syncs per batch, as counted by the sync helper, and every synchronising call CUDA's
  sync debug mode saw (the helper's own included, so the two should match); the same for a
  text batch (tiny GPT-2, 32 new tokens).
It runs in a few minutes on one GPU, and with `--device cpu --shape tiny` anywhere (a smoke run).
"""

import argparse
import statistics
import tempfile
import time
import warnings
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

SD15_UNET = dict(
    sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
    block_out_channels=(320, 640, 1280, 1280),
    down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
    up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
    cross_attention_dim=768, attention_head_dim=8,
)
SD15_VAE = dict(
    in_channels=3, out_channels=3, latent_channels=4, layers_per_block=2, sample_size=512,
    block_out_channels=(128, 256, 512, 512),
    down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
)


def build_sd15_shaped(out_dir: Path) -> None:
    from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKL
    from diffusers.models.unets.unet_2d_condition import UNet2DConditionModel
    from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import (
        StableDiffusionPipeline,
    )
    from transformers import CLIPTextConfig, CLIPTextModel

    from modelbuild.tiny_diffusion import _scheduler
    from modelbuild.tokenizers import train_clip_tokenizer

    tokenizer = train_clip_tokenizer()
    text = CLIPTextConfig(
        vocab_size=len(tokenizer), hidden_size=768, intermediate_size=3072,
        num_hidden_layers=12, num_attention_heads=12,
        max_position_embeddings=tokenizer.model_max_length,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    # diffusers annotates `scheduler` with its enum of scheduler names, and the two optional
    # parts without None, which its own docs allow (requires_safety_checker=False)
    pipe = StableDiffusionPipeline(
        vae=AutoencoderKL(**SD15_VAE), text_encoder=CLIPTextModel(text), tokenizer=tokenizer,
        unet=UNet2DConditionModel(**SD15_UNET),
        scheduler=_scheduler(),  # type: ignore[arg-type]
        safety_checker=None,  # type: ignore[arg-type]
        feature_extractor=None,  # type: ignore[arg-type]
        requires_safety_checker=False,
    )
    pipe.save_pretrained(out_dir)


def timed(fn, device: torch.device) -> float:
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def hidden_syncs(fn, device: torch.device) -> list[str]:
    """Synchronising CUDA calls made by `fn`, as CUDA's sync debug mode reports them."""
    if device.type != "cuda":
        fn()
        return []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return [str(w.message).splitlines()[0] for w in seen]


def image_bench(args, device: torch.device, tmp: Path) -> dict:
    from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import (
        StableDiffusionPipeline,
    )

    from modelbuild.tiny_diffusion import build_tiny_sd
    from services.worker.engine import sync
    from services.worker.engine.engine import Engine
    from services.worker.pipelines.image import StableDiffusionImagePipeline
    from shared.messages import ImageItem
    from shared.registry import ModelSpec

    path = tmp / "sd"
    (build_sd15_shaped if args.shape == "sd15" else build_tiny_sd)(path)
    size = args.size or (512 if args.shape == "sd15" else 64)
    dtype = "float16" if device.type == "cuda" else "float32"
    spec = ModelSpec(name="bench-sd", kind="stable-diffusion", path=path, dtype=dtype,
                     max_batch=args.batch, pool_sets=1,
                     defaults={"width": size, "height": size, "steps": args.steps})
    ours = StableDiffusionImagePipeline(spec, device)
    ours.setup()
    reference = ours.pipe
    assert isinstance(reference, StableDiffusionPipeline)  # what a stable-diffusion spec loads
    items = [ImageItem(prompt=f"a photo of thing number {i}", seed=i, width=size, height=size,
                       steps=args.steps, guidance_scale=7.5) for i in range(args.batch)]

    engine = Engine(ours)

    def run_ours():
        return engine.run(items)

    def run_reference():
        gens = [torch.Generator("cpu").manual_seed(i.seed) for i in items]
        shape = (4, size // 8, size // 8)
        latents = torch.cat([torch.randn((1, *shape), generator=g) for g in gens])
        return reference(prompt=[i.prompt for i in items], width=size, height=size,
                         num_inference_steps=args.steps, guidance_scale=7.5, generator=gens,
                         latents=latents.to(device, ours.dtype), output_type="np").images

    run_ours(), run_reference()  # warm-up (kernels, allocator)
    t_ours, t_ref = [], []
    for _ in range(args.reps):
        t_ours.append(timed(run_ours, device))
        t_ref.append(timed(run_reference, device))
    before = sync.count(spec.name)
    hidden = hidden_syncs(run_ours, device)
    counted = sync.count(spec.name) - before
    import io

    from PIL import Image

    mine = [np.asarray(Image.open(io.BytesIO(r.png))).astype(int) for r in run_ours()]
    ref = (run_reference() * 255).round().astype(int)
    diff = max(int(np.abs(a - b).max()) for a, b in zip(mine, ref, strict=True))
    return {"ours": statistics.median(t_ours), "reference": statistics.median(t_ref),
            "syncs": counted, "hidden": hidden, "diff": diff, "size": size}


def text_bench(args, device: torch.device, tmp: Path) -> dict:
    from modelbuild.tiny_gpt2 import build
    from services.worker.engine import sync
    from services.worker.engine.engine import Engine
    from services.worker.pipelines.text import CausalLMTextPipeline
    from shared.messages import TextItem
    from shared.registry import ModelSpec

    build(tmp / "gpt2")
    spec = ModelSpec(name="bench-gpt2", kind="causal-lm", path=tmp / "gpt2",
                     max_batch=args.batch, pool_sets=1)
    pipe = CausalLMTextPipeline(spec, device)
    pipe.setup()
    items = [TextItem(prompt=f"Item {i} says", max_new_tokens=32) for i in range(args.batch)]
    engine = Engine(pipe)
    engine.run(items)
    before = sync.count(spec.name)
    hidden = hidden_syncs(lambda: engine.run(items), device)
    return {"syncs": sync.count(spec.name) - before, "hidden": hidden}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", choices=["sd15", "tiny"], default="sd15")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--size", type=int, default=0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run it where one is, or pass --device cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    with tempfile.TemporaryDirectory() as tmp:
        image = image_bench(args, device, Path(tmp))
        text = text_bench(args, device, Path(tmp))
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"GPU engine check on {name}, torch {torch.__version__}, {when}: model with "
        f"{args.shape} shapes (random weights), batch {args.batch}, {image['size']}x"
        f"{image['size']}, {args.steps} steps.", "",
        "| what | figure |", "|---|---|",
        f"| Fibermill graph, s per batch (median of {args.reps}) | {image['ours']:.3f} |",
        f"| diffusers StableDiffusionPipeline, s per batch | {image['reference']:.3f} |",
        f"| throughput, Fibermill / diffusers | {image['reference'] / image['ours']:.2f}x |",
        f"| largest pixel difference, 0-255 | {image['diff']} |",
        f"| image syncs per batch (helper) | {image['syncs']} |",
        f"| image: synchronising calls CUDA's sync debug mode saw (the helper's included) | "
        f"{len(image['hidden'])} |",
        f"| text: token reads for {args.batch} items of 32 tokens (helper; one per decoder "
        f"iteration) | {text['syncs']} |",
        f"| text: synchronising calls the sync debug mode saw | {len(text['hidden'])} |",
    ]
    for where, hidden in (("image", image["hidden"]), ("text", text["hidden"])):
        for msg in sorted(set(hidden))[:5]:
            lines.append(f"\n{where}, sync debug mode: {msg}")
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.write_text(report + "\n")


if __name__ == "__main__":
    main()
