"""Sub-requests: the unit of work sent through Celery (one per prompt x image), and their results.

Everything here crosses a process boundary as JSON. A sub-request carries ids and the small
per-item input, never model state.
"""

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from shared.class_prompts import resolve_class
from shared.inputs import ImageGenerationInput, TextGenerationInput
from shared.job import JobError
from shared.registry import ModelKind, ModelSpec


class TextItem(BaseModel):
    kind: Literal["text"] = "text"
    prompt: str
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    stop: list[str] = []


class ImageItem(BaseModel):
    kind: Literal["image"] = "image"
    prompt: str
    negative_prompt: str = ""
    width: int
    height: int
    steps: int
    guidance_scale: float
    seed: int
    class_label: int | None = None  # class-conditional models only


Item = Annotated[TextItem | ImageItem, Field(discriminator="kind")]


class SubRequest(BaseModel):
    job_id: str
    index: int
    model: str
    item: Item
    sent_at: float | None = None

    @property
    def member(self) -> str:
        """The id of this sub-request in lease and attempt bookkeeping."""
        return f"{self.job_id}:{self.index}"


class SubResult(BaseModel):
    """What a worker stores once per (job, index); image bytes are stored beside it."""

    index: int
    output: dict | None = None
    error: JobError | None = None
    worker: str = ""
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


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
