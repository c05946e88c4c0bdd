"""A model's own input parameters, with its ranges and defaults (GET /v1/models): what a form
or a client needs to build a valid request for that model, and nothing of the other task."""

from typing import Any

from shared.inputs import INPUTS
from shared.registry import Defaults, Limits, ModelKind, ModelSpec, Task

# The registry's limits and defaults that apply to each task.
TASK_LIMITS: dict[Task, tuple[str, ...]] = {
    "text-generation": ("max_prompts", "max_prompt_chars", "max_new_tokens",
                        "max_stop_sequences"),
    "image-generation": ("max_prompts", "max_prompt_chars", "max_images_per_prompt",
                         "max_steps", "min_size", "max_size"),
}
TASK_DEFAULTS: dict[Task, tuple[str, ...]] = {
    "text-generation": ("max_new_tokens",),
    "image-generation": ("steps", "width", "height", "guidance_scale"),
}
_KEEP = ("type", "default", "minimum", "maximum", "exclusiveMinimum", "multipleOf", "minItems",
         "maxItems", "items", "description")


def limits(spec: ModelSpec) -> dict[str, Any]:
    return spec.limits.model_dump(include=set(TASK_LIMITS[spec.task]))


def defaults(spec: ModelSpec) -> dict[str, Any]:
    return spec.defaults.model_dump(include=set(TASK_DEFAULTS[spec.task]))


def parameters(spec: ModelSpec) -> dict[str, dict[str, Any]]:
    """JSON Schema for each input field of the model's task, narrowed to this model: its
    limits as bounds and its defaults as defaults."""
    props = INPUTS[spec.task].model_json_schema()["properties"]
    out = {name: _flat(prop) for name, prop in props.items()}
    for name, narrowed in _narrowing(spec, spec.limits, spec.defaults).items():
        out[name] |= narrowed
    return out


def _flat(prop: dict[str, Any]) -> dict[str, Any]:
    # An optional field's schema is anyOf [its type, null]: the parameter is its type.
    merged = dict(prop)
    for branch in prop.get("anyOf", []):
        if branch.get("type") != "null":
            merged |= branch
    return {k: merged[k] for k in _KEEP if k in merged}


def _narrowing(spec: ModelSpec, lim: Limits, d: Defaults) -> dict[str, dict[str, Any]]:
    prompt = {"type": "string", "minLength": 1, "maxLength": lim.max_prompt_chars}
    if spec.kind == ModelKind.CLASS_DDPM:
        prompt["description"] = "Names one class: " + ", ".join("/".join(c) for c in spec.classes)
    common = {"prompts": {"maxItems": lim.max_prompts, "items": prompt}}
    if spec.task == "text-generation":
        return common | {
            "max_new_tokens": {"default": d.max_new_tokens, "maximum": lim.max_new_tokens},
            "stop": {"maxItems": lim.max_stop_sequences},
        }
    size = {"minimum": lim.min_size, "maximum": lim.max_size, "multipleOf": 8}
    return common | {
        "steps": {"default": d.steps, "maximum": lim.max_steps},
        "width": {**size, "default": d.width},
        "height": {**size, "default": d.height},
        "guidance_scale": {"default": d.guidance_scale},
        "num_images_per_prompt": {"maximum": lim.max_images_per_prompt},
    }
