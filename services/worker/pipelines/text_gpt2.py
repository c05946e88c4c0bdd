"""GPT-2's forward for the decoder, without the library's per-call work.

transformers' `GPT2LMHeadModel.forward` spends 1.3 to 1.7 ms a call on a 2-core CPU outside
the tensor ops (module call hooks, config lookups, argument plumbing through every layer, a
mask preparation that a prepared 4-D mask makes moot). Measured on the 6x256 GPT-2 of the
benchmarks: a 32-row decode step took 10.1 ms through it and 8.5 ms through this; a one-row
prefill 5.0 ms and 3.3 ms. On a GPU the same overhead is host time that the device waits
through between kernels.

This runs the same ops, in the same order, on the model's own parameters and activation
module, so its logits are bit for bit the model's (tests/worker/test_text_gpt2.py checks that
for prefill and decode). A GPT-2 whose config asks for anything it does not reproduce keeps the
library's forward (`fits`).
"""

from dataclasses import dataclass
from typing import TypeGuard, cast

import torch
import torch.nn.functional as F
from transformers.models.gpt2.modeling_gpt2 import GPT2Block, GPT2LMHeadModel
from transformers.pytorch_utils import Conv1D

from services.worker.engine.text_cache import PagedCache


@dataclass(frozen=True)
class _Block:
    ln_1: torch.nn.LayerNorm
    c_attn: Conv1D  # weight is (in, out)
    c_proj: Conv1D
    scaling: float
    ln_2: torch.nn.LayerNorm
    c_fc: Conv1D
    act: torch.nn.Module
    mlp_proj: Conv1D

    @classmethod
    def of(cls, block: GPT2Block) -> "_Block":
        attn, mlp = block.attn, block.mlp
        return cls(block.ln_1, attn.c_attn, attn.c_proj, attn.scaling, block.ln_2, mlp.c_fc,
                   mlp.act, mlp.c_proj)


def fits(model: torch.nn.Module) -> TypeGuard[GPT2LMHeadModel]:
    """Whether `GPT2Forward` gives this model's own logits: a GPT-2 LM head model with SDPA
    self-attention only (eager attention and cross-attention compute differently)."""
    config = model.config
    return (getattr(config, "model_type", None) == "gpt2"
            and type(model).__name__ == "GPT2LMHeadModel"
            and getattr(config, "_attn_implementation", None) == "sdpa"
            and not getattr(config, "add_cross_attention", False))


class GPT2Forward:
    def __init__(self, model: GPT2LMHeadModel) -> None:
        self.transformer = model.transformer
        self.lm_head = model.lm_head
        config = model.config
        self.width: int = config.hidden_size
        self.heads: int = config.num_attention_heads
        self.head_dim = self.width // self.heads
        # A ModuleList yields plain Modules; GPT2Model fills it with GPT2Blocks only.
        self.blocks = [_Block.of(cast(GPT2Block, b)) for b in self.transformer.h]

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                 cache: PagedCache) -> torch.Tensor:
        """The last position's logits, (rows, vocab); `mask` is additive, (rows, 1, queries,
        keys); `cache.update` takes each layer's keys and values and gives back what to
        attend to."""
        rows, length = ids.shape
        width, heads, head_dim = self.width, self.heads, self.head_dim
        t = self.transformer
        h = t.wte(ids) + t.wpe(positions)
        for i, b in enumerate(self.blocks):
            x = F.layer_norm(h, b.ln_1.normalized_shape, b.ln_1.weight, b.ln_1.bias, b.ln_1.eps)
            qkv = torch.addmm(b.c_attn.bias, x.view(-1, width), b.c_attn.weight)
            q, k, v = qkv.view(rows, length, 3 * width).split(width, dim=2)
            q = q.view(rows, length, heads, head_dim).transpose(1, 2)
            k = k.view(rows, length, heads, head_dim).transpose(1, 2)
            v = v.view(rows, length, heads, head_dim).transpose(1, 2)
            k, v = cache.update(k, v, i)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0,
                                               scale=b.scaling)
            a = a.transpose(1, 2).contiguous().reshape(rows * length, width)
            h = torch.addmm(b.c_proj.bias, a, b.c_proj.weight).view(rows, length, width) + h
            x = F.layer_norm(h, b.ln_2.normalized_shape, b.ln_2.weight, b.ln_2.bias, b.ln_2.eps)
            x = b.act(torch.addmm(b.c_fc.bias, x.view(-1, width), b.c_fc.weight))
            h = h + torch.addmm(b.mlp_proj.bias, x, b.mlp_proj.weight).view(rows, length, width)
        # Layer norm is per position, so normalising only the last one changes no value.
        last = t.ln_f(h[:, -1])
        return self.lm_head(last)
