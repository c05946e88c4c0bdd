"""The digits demo model: a class-conditional pixel-space DDPM trained on scikit-learn's digits.

scikit-learn ships the 1797 8x8 digit images with the package, so this trains offline, on CPU,
in a couple of minutes: a fixed number of steps from a fixed seed, so that the same command
rebuilds the committed weights. Images are upsampled to 16x16 for the model; to judge samples,
they are averaged back down to 8x8 and read by an SVM trained on the real digits, and the share
it reads as the requested digit is the score.

    python -m modelbuild.digits --out models/digits
"""

import argparse
import io
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from diffusers.models.unets.unet_2d import UNet2DModel
from diffusers.schedulers.scheduling_ddpm import DDPMScheduler
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.svm import SVC

SIZE = 16
NUM_CLASSES = 10
NULL_CLASS = NUM_CLASSES  # the extra class embedding guidance uses for "no class"
# Same words as the registry entry, so evaluation resolves prompts the way the service does.
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
CLASSES = [[str(i), word] for i, word in enumerate(WORDS)]
# The registry's defaults for this model: the accuracy target is measured with these.
STEPS = 50
GUIDANCE = 2.0
# Training steps of the committed model (about two and a half minutes on two cores).
TRAIN_STEPS = 500


def dataset() -> tuple[torch.Tensor, torch.Tensor]:
    """All digits as (N, 1, 16, 16) floats in [-1, 1], and their labels."""
    digits = load_digits()
    small = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16
    # Bilinear rather than nearest: smooth strokes are easier for a conv net to draw than
    # 2x2 blocks, and averaging back down to 8x8 loses little.
    large = F.interpolate(small, size=(SIZE, SIZE), mode="bilinear", align_corners=False)
    return large * 2 - 1, torch.tensor(digits.target)


def to_8x8(pixels: np.ndarray) -> np.ndarray:
    """(N, 16, 16) uint8 images -> (N, 64) features on the 0..16 scale of the original data."""
    blocks = pixels.reshape(len(pixels), 8, 2, 8, 2).astype(np.float64)
    return blocks.mean(axis=(2, 4)).reshape(len(pixels), 64) / 255 * 16


def classifier() -> SVC:
    """An SVM fit to the real digits after the same 16x16 uint8 round trip samples go through."""
    images, labels = dataset()
    pixels = ((images[:, 0] + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).numpy()
    return SVC(C=10, gamma="scale").fit(to_8x8(pixels), labels.numpy())


def build_unet() -> UNet2DModel:
    # No attention blocks: at 16x16 convolutions suffice, and they keep training fast on CPU.
    return UNet2DModel(
        sample_size=SIZE,
        in_channels=1,
        out_channels=1,
        layers_per_block=1,
        block_out_channels=(32, 64, 64),
        down_block_types=("DownBlock2D",) * 3,
        up_block_types=("UpBlock2D",) * 3,
        norm_num_groups=8,
        num_class_embeds=NUM_CLASSES + 1,
    )


def noise_scheduler() -> DDPMScheduler:
    """The training schedule; saved beside the UNet, it is also the config the worker's DDIM
    sampler is built from."""
    return DDPMScheduler(
        num_train_timesteps=1000,
        # The cosine schedule spends fewer steps on nearly-clean images, which tiny
        # images need less of than photos do.
        beta_schedule="squaredcos_cap_v2",
        # v rather than epsilon: this schedule ends at a signal level of sqrt(2.4e-9), where
        # an epsilon model's clean-image estimate (x - sqrt(1 - a) eps) / sqrt(a) multiplies
        # its error by up to 20,000. The v estimate, sqrt(a) x - sqrt(1 - a) v, multiplies it
        # by at most 1, so sampling needs no clipping to stay in range.
        prediction_type="v_prediction",
        # No clipping: diffusers' DDIM clips the clean-image estimate but keeps the unclipped
        # noise estimate for the step, so every step in which clipping bites moves the sample
        # by sqrt(a_prev) times the clipped amount, however small the step, and over hundreds
        # of steps that piles up into noise. The epsilon model with clipping read 1.0 of digits
        # right at 50 steps and 0.17 at 400 and 1000; this model with it, 0.69 at 50.
        clip_sample=False,
        timestep_spacing="trailing",
    )


def train(
    out_dir: Path,
    steps: int | None = TRAIN_STEPS,
    seconds_budget: float = 120.0,
    batch_size: int = 128,
    label_dropout: float = 0.12,
    max_lr: float = 2e-3,
    seed: int = 0,
) -> dict:
    """Train and save `unet/` and `scheduler/` to `out_dir`; returns a few training numbers.

    With `steps=None`, the step count is chosen from the speed of the first steps so that
    training takes about `seconds_budget` (the learning rate schedule needs it up front); the
    weights then depend on the machine's speed.
    """
    torch.set_num_threads(2)
    torch.manual_seed(seed)
    started = time.monotonic()
    images, labels = dataset()
    unet = build_unet()
    ema = build_unet().requires_grad_(False)
    ema.load_state_dict(unet.state_dict())
    scheduler = noise_scheduler()
    # Starts at the one-cycle schedule's initial rate, which takes over after calibration.
    optimizer = torch.optim.AdamW(unet.parameters(), lr=max_lr / 25, weight_decay=1e-4)

    def batch_loss() -> torch.Tensor:
        index = torch.randint(0, len(images), (batch_size,))
        clean, label = images[index], labels[index].clone()
        # Some labels become "no class", so the same network also learns the unconditional
        # prediction that classifier-free guidance subtracts.
        label[torch.rand(batch_size) < label_dropout] = NULL_CLASS
        noise = torch.randn_like(clean)
        t = torch.randint(0, scheduler.config["num_train_timesteps"], (batch_size,))
        # diffusers annotates timesteps as the legacy torch.IntTensor; any integer tensor works
        noisy = scheduler.add_noise(clean, noise, t)  # type: ignore[arg-type]
        velocity = scheduler.get_velocity(clean, noise, t)  # type: ignore[arg-type]
        return F.mse_loss(unet(noisy, t, class_labels=label).sample, velocity)

    # The first steps are slow (allocator and kernel warm-up), so speed is timed after them.
    warmup, calibration = 3, 13
    total = steps
    lr_schedule = None
    losses: list[float] = []
    step = 0
    while total is None or step < total:
        if total is None and step == warmup:
            timed_from = time.monotonic()
        if total is None and step == calibration:
            now = time.monotonic()
            per_step = (now - timed_from) / (calibration - warmup)
            total = step + max(1, int((seconds_budget - (now - started)) / per_step))
        if lr_schedule is None and total is not None:
            # One-cycle needs a few steps to make a cycle; a shorter run just ends early.
            lr_schedule = torch.optim.lr_scheduler.OneCycleLR(
                optimizer, max_lr=max_lr, total_steps=max(total - step, 20), pct_start=0.1
            )
        loss = batch_loss()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(unet.parameters(), 1.0)
        optimizer.step()
        if lr_schedule is not None:
            lr_schedule.step()
        # An average of recent weights samples cleaner than the last weights; the decay
        # ramps up so that early, poor weights are soon forgotten.
        decay = min(0.995, (1 + step) / (10 + step))
        with torch.no_grad():
            for avg, new in zip(ema.parameters(), unet.parameters(), strict=True):
                avg.lerp_(new, 1 - decay)
        losses.append(loss.item())
        step += 1

    out_dir = Path(out_dir)
    ema.save_pretrained(out_dir / "unet")
    scheduler.save_pretrained(out_dir / "scheduler")
    return {
        "steps": step,
        "seconds": time.monotonic() - started,
        "final_loss": float(np.mean(losses[-50:])),
    }


def sample(
    model_dir: Path,
    labels: list[int],
    seeds: list[int],
    steps: int = STEPS,
    guidance_scale: float = GUIDANCE,
    batch_size: int = 100,
) -> np.ndarray:
    """(N, 16, 16) uint8 samples through the service's own image pipeline."""
    # Imported here so that training does not need the worker's pipeline stack.
    from services.worker.engine.engine import Engine
    from services.worker.engine.results import ImageResult
    from services.worker.pipelines.image import ClassDDPMImagePipeline
    from shared.messages import ImageItem
    from shared.registry import ModelSpec

    spec = ModelSpec(name="digits", kind="class-ddpm", path=Path(model_dir), classes=CLASSES)
    pipeline = ClassDDPMImagePipeline(spec, torch.device("cpu"))
    pipeline.setup()
    items = [
        ImageItem(
            prompt=CLASSES[label][1],
            width=SIZE,
            height=SIZE,
            steps=steps,
            guidance_scale=guidance_scale,
            seed=seed,
            class_label=label,
        )
        for label, seed in zip(labels, seeds, strict=True)
    ]
    engine = Engine(pipeline)
    results = []
    for start in range(0, len(items), batch_size):
        results += engine.run(items[start : start + batch_size])
    pngs = [r.png for r in results if isinstance(r, ImageResult)]
    assert len(pngs) == len(results), "an image pipeline answered with text"
    return np.stack([np.asarray(Image.open(io.BytesIO(png))) for png in pngs])


def evaluate(
    model_dir: Path,
    n_per_class: int = 20,
    steps: int = STEPS,
    guidance_scale: float = GUIDANCE,
    seed: int = 0,
) -> float:
    """The share of samples (n per digit) that an SVM reads as the digit that was asked for."""
    torch.set_num_threads(2)
    labels = [label for label in range(NUM_CLASSES) for _ in range(n_per_class)]
    seeds = [seed + i for i in range(len(labels))]
    pixels = sample(model_dir, labels, seeds, steps, guidance_scale)
    predicted = classifier().predict(to_8x8(pixels))
    return float(np.mean(predicted == np.array(labels)))


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m modelbuild.digits", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, default=Path("models/digits"))
    parser.add_argument(
        "--steps", type=int, default=TRAIN_STEPS, help="training steps (the committed model's)"
    )
    parser.add_argument(
        "--seconds", type=float, help="train for about this long instead of a fixed step count"
    )
    parser.add_argument("--n-per-class", type=int, default=50, help="samples per digit to score")
    args = parser.parse_args()
    if args.seconds is None:
        stats = train(args.out, steps=args.steps)
    else:
        stats = train(args.out, steps=None, seconds_budget=args.seconds)
    print(
        f"trained {stats['steps']} steps in {stats['seconds']:.0f} s "
        f"(final loss {stats['final_loss']:.4f}) -> {args.out}"
    )
    started = time.monotonic()
    accuracy = evaluate(args.out, n_per_class=args.n_per_class)
    print(
        f"SVM accuracy {accuracy:.3f} on {args.n_per_class} samples per digit "
        f"({STEPS} steps, guidance {GUIDANCE}; {time.monotonic() - started:.0f} s)"
    )


if __name__ == "__main__":
    main()
