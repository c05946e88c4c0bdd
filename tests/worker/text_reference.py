"""Reference runs the text pipeline tests compare against."""

import torch

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
