"""Stable Diffusion and SDXL pipelines from tiny configs with random weights, for tests.

The layouts match the real ones (`model_index.json`, one folder per component), so the same
loading code serves a real checkpoint and these; only the sizes differ. The VAE keeps the real
x8 downsampling, so a 64x64 image has an 8x8 latent just as a 512x512 one has 64x64.
The images are noise-like; they only have to be deterministic and the right size.
"""

from pathlib import Path

import torch
from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKL
from diffusers.models.unets.unet_2d_condition import UNet2DConditionModel
from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import StableDiffusionPipeline
from diffusers.pipelines.stable_diffusion_xl.pipeline_stable_diffusion_xl import (
    StableDiffusionXLPipeline,
)
from diffusers.schedulers.scheduling_ddim import DDIMScheduler
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

from modelbuild.tokenizers import train_clip_tokenizer

SEED = 0
TEXT_WIDTH = 32
SAMPLE_SIZE = 8  # latent pixels; 64 image pixels


def _scheduler() -> DDIMScheduler:
    # The real checkpoints' noise schedule. DDIM rather than SDXL's usual Euler: the sigma-based
    # schedulers emit a NumPy DeprecationWarning with this torch, and tests fail on warnings.
    return DDIMScheduler(
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        steps_offset=1,
        timestep_spacing="leading",
        clip_sample=False,
        set_alpha_to_one=False,
    )


def _vae() -> AutoencoderKL:
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        # Four blocks give the real x8 downsampling; the widths are what keeps it tiny.
        block_out_channels=(8, 8, 16, 16),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        sample_size=SAMPLE_SIZE * 8,
    )


def _text_config(tokenizer, projection_dim: int = TEXT_WIDTH) -> CLIPTextConfig:
    return CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=TEXT_WIDTH,
        intermediate_size=64,
        projection_dim=projection_dim,
        # SDXL reads the penultimate hidden state, so at least two layers.
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=tokenizer.model_max_length,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_tiny_sd(out_dir: Path) -> None:
    """Write a StableDiffusionPipeline layout to `out_dir` (created if missing)."""
    tokenizer = train_clip_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        unet = UNet2DConditionModel(
            sample_size=SAMPLE_SIZE,
            in_channels=4,
            out_channels=4,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            block_out_channels=(16, 32),
            layers_per_block=1,
            norm_num_groups=8,
            attention_head_dim=4,
            cross_attention_dim=TEXT_WIDTH,
        )
        vae = _vae()
        text_encoder = CLIPTextModel(_text_config(tokenizer))
    # diffusers annotates `scheduler` with its enum of scheduler names, and the two optional
    # parts without None, which its own docs allow (requires_safety_checker=False)
    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=_scheduler(),  # type: ignore[arg-type]
        safety_checker=None,  # type: ignore[arg-type]
        feature_extractor=None,  # type: ignore[arg-type]
        requires_safety_checker=False,
    )
    pipe.save_pretrained(out_dir)


def build_tiny_sdxl(out_dir: Path) -> None:
    """Write a StableDiffusionXLPipeline layout (two text encoders) to `out_dir`."""
    tokenizer = train_clip_tokenizer()
    time_embed_dim = 8
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        unet = UNet2DConditionModel(
            sample_size=SAMPLE_SIZE,
            in_channels=4,
            out_channels=4,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            block_out_channels=(16, 32),
            layers_per_block=1,
            norm_num_groups=8,
            attention_head_dim=(2, 4),
            use_linear_projection=True,
            transformer_layers_per_block=(1, 1),
            # Both encoders' hidden states, concatenated.
            cross_attention_dim=2 * TEXT_WIDTH,
            addition_embed_type="text_time",
            addition_time_embed_dim=time_embed_dim,
            # Six size/crop numbers, each embedded, plus the second encoder's pooled text.
            projection_class_embeddings_input_dim=6 * time_embed_dim + TEXT_WIDTH,
        )
        vae = _vae()
        text_encoder = CLIPTextModel(_text_config(tokenizer))
        text_encoder_2 = CLIPTextModelWithProjection(_text_config(tokenizer))
    pipe = StableDiffusionXLPipeline(
        vae=vae,
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer,
        unet=unet,
        scheduler=_scheduler(),  # type: ignore[arg-type]  # an enum in diffusers' annotation
        add_watermarker=False,
    )
    pipe.save_pretrained(out_dir)
