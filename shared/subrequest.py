"""Split a job's input into the items of its sub-requests (shared/messages.py)."""

from shared.class_prompts import resolve_class
from shared.inputs import ImageGenerationInput, TextGenerationInput
from shared.messages import ImageItem, TextItem
from shared.registry import ModelKind, ModelSpec


def split_items(
    spec: ModelSpec, inp: TextGenerationInput | ImageGenerationInput, seed: int
) -> list[TextItem | ImageItem]:
    """One item per prompt (text) or per prompt x image (images); item i uses `seed + i`."""
    if isinstance(inp, TextGenerationInput):
        max_new = inp.max_new_tokens or spec.defaults.max_new_tokens
        return [
            TextItem(
                prompt=p,
                max_new_tokens=max_new,
                temperature=inp.temperature,
                top_p=inp.top_p,
                top_k=inp.top_k,
                seed=seed + i,
                stop=inp.stop,
                stream=inp.stream,
                logprobs=inp.logprobs,
                response_format=inp.response_format,
            )
            for i, p in enumerate(inp.prompts)
        ]
    d = spec.defaults
    items: list[TextItem | ImageItem] = []
    for p in inp.prompts:
        label = resolve_class(p, spec.classes) if spec.kind == ModelKind.CLASS_DDPM else None
        for _ in range(inp.num_images_per_prompt):
            items.append(
                ImageItem(
                    prompt=p,
                    negative_prompt=inp.negative_prompt,
                    width=inp.width or d.width,
                    height=inp.height or d.height,
                    steps=inp.steps or d.steps,
                    guidance_scale=d.guidance_scale
                    if inp.guidance_scale is None
                    else inp.guidance_scale,
                    seed=seed + len(items),
                    class_label=label,
                )
            )
    return items
