"""The attention masks a text model's layers take, from the decoder's one boolean mask.

The decoder prepares one causal mask over the cache's columns (engine/decoder.py), and
transformers uses a prepared mask as it is: a model whose layers slide over a window (Mistral,
Phi-3, Gemma-2's every other layer) would attend past its window with it, and its tokens left
`generate`'s as soon as a row held more tokens than the window. Here the window is cut out of
that mask. A key's position is counted from the mask itself: a row's own columns, in order,
are its tokens in order (prompts are left-padded, gaps and other rows' columns are masked out),
so the running count of the last query's visible keys is each key's position.
"""

import torch
from transformers import PretrainedConfig

SLIDING = "sliding_attention"


def sliding_window(config: PretrainedConfig) -> int | None:
    """The window of the layers that slide, if any does."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if not window or (layer_types is not None and SLIDING not in layer_types):
        return None
    return int(window)


def layer_masks(config: PretrainedConfig, mask: torch.Tensor,
                positions: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
    """`mask` (rows, 1, queries, keys), True where a query may attend, as the model's layers
    take it: unchanged without a window; cut to the window where every layer slides; one mask
    per layer type where only some do. `positions` (rows, queries) are the queries'."""
    window = sliding_window(config)
    if window is None:
        return mask
    keys = mask[:, :, -1:, :].long().cumsum(-1) - 1  # (rows, 1, 1, keys)
    sliding = mask & (positions[:, None, :, None] - keys < window)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:
        return sliding
    return {kind: sliding if kind == SLIDING else mask for kind in set(layer_types)}
