"""Reference runs the text pipeline tests compare against."""

import torch

from services.worker.engine import sync
from services.worker.pipelines.text import CausalLMTextPipeline
from shared.messages import TextItem
from tests.worker.engines import engine_for


def greedy_ids(pipe: CausalLMTextPipeline, prompt: str, n: int) -> list[int]:
    """Reference greedy continuation: the full prompt re-run every step, no cache, no padding."""
    ids = pipe.tokenizer(prompt, return_tensors="pt")["input_ids"]
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(n):
            token = int(pipe.model(input_ids=ids).logits[0, -1].argmax())
            out.append(token)
            ids = torch.cat([ids, torch.tensor([[token]])], dim=-1)
    return out


def alone(pipe: CausalLMTextPipeline, items: list[TextItem]) -> list:
    """Each item run as a batch of one."""
    return [engine_for(pipe).run([item])[0] for item in items]


def reads_per_iteration(pipe: CausalLMTextPipeline, items: list[TextItem]) -> tuple[int, int]:
    """Run `items` through the pipeline's engine: the counted host reads it made, and the
    decoder iterations it took."""
    decoder = engine_for(pipe).scheduling
    reads, iterations = sync.count(pipe.spec.name), 0
    iterate = decoder._iterate

    def counted(admit):
        nonlocal iterations
        iterations += 1
        return iterate(admit)

    decoder._iterate = counted
    try:
        engine_for(pipe).run(items)
    finally:
        del decoder._iterate
    return sync.count(pipe.spec.name) - reads, iterations
