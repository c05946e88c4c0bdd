"""Token log-probabilities from the continuous decoder: each generated token's, and its most
likely alternatives', under the model's own distribution (as `generate`'s logits give it),
read with the tokens in the iteration's one host read; rows that did not ask get none, and
asking changes no token."""

from pathlib import Path

import pytest
import torch

from services.worker.engine.text_rows import Sequence
from services.worker.pipelines.text import CausalLMTextPipeline
from shared.messages import TextItem
from shared.registry import ModelKind, ModelSpec
from tests.worker.engines import engine_for
from tests.worker.text_reference import reads_per_iteration

PROMPTS = ["Hello there", "The quick brown fox jumps over", "def split(items):"]
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def pipeline(model_dir: Path) -> CausalLMTextPipeline:
    spec = ModelSpec(name="tiny-gpt2-logprobs", kind=ModelKind.CAUSAL_LM,
                     path=model_dir / "tiny-gpt2")
    pipe = CausalLMTextPipeline(spec, torch.device("cpu"))
    pipe.setup()
    pipe.eos_ids = frozenset()  # every row runs its budget, as the reference does
    return pipe


def _reference(pipe: CausalLMTextPipeline, prompt: str) -> tuple[list[int], torch.Tensor]:
    """`generate`'s greedy tokens and the log-softmax of its logits at each step."""
    ids = pipe.tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        out = pipe.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                  pad_token_id=pipe.pad_id, output_logits=True,
                                  return_dict_in_generate=True)
    logprobs = torch.stack(out.logits)[:, 0].float().log_softmax(-1)
    return out.sequences[0, ids.shape[1]:].tolist(), logprobs


def test_greedy_rows_log_probabilities_are_the_models(pipeline: CausalLMTextPipeline) -> None:
    items = [TextItem(prompt=p, max_new_tokens=NEW_TOKENS, logprobs=3) for p in PROMPTS]
    results = engine_for(pipeline).run(items)
    for prompt, result in zip(PROMPTS, results, strict=True):
        tokens, logprobs = _reference(pipeline, prompt)
        assert result.logprobs is not None and len(result.logprobs) == result.tokens
        for step, (token, entry) in enumerate(zip(tokens, result.logprobs, strict=True)):
            assert entry.logprob == pytest.approx(float(logprobs[step, token]), abs=1e-4)
            assert entry.token == pipeline.tokenizer.decode([token])
            values, _ = logprobs[step].topk(3)
            assert [a.logprob for a in entry.top_logprobs] == pytest.approx(
                values.tolist(), abs=1e-4)
            # Greedy: the chosen token is the most likely one.
            assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-6)
            assert entry.top_logprobs[0].token == entry.token
            assert entry.top_logprobs[0].bytes == entry.bytes


def test_sampled_rows_score_the_token_they_drew(pipeline: CausalLMTextPipeline,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    drawn: list[int] = []
    push = Sequence.push

    def recording(self, token, model, score=None):
        drawn.append(token)
        return push(self, token, model, score)

    monkeypatch.setattr(Sequence, "push", recording)
    item = TextItem(prompt=PROMPTS[1], max_new_tokens=NEW_TOKENS, temperature=1.5, seed=4,
                    logprobs=0)
    result = engine_for(pipeline).run([item])[0]
    assert result.logprobs is not None and len(result.logprobs) == NEW_TOKENS == len(drawn)
    # The model over the prompt and the drawn tokens: its distribution at each place.
    ids = pipeline.tokenizer(PROMPTS[1])["input_ids"]
    with torch.inference_mode():
        logits = pipeline.model(torch.tensor([ids + drawn])).logits[0]
    logprobs = logits[len(ids) - 1:-1].float().log_softmax(-1)
    expected = [float(logprobs[i, t]) for i, t in enumerate(drawn)]
    assert [e.logprob for e in result.logprobs] == pytest.approx(expected, abs=1e-4)
    assert all(e.top_logprobs == [] for e in result.logprobs)
    assert any(e.logprob < float(logprobs[i].max()) - 1e-3 for i, e in
               enumerate(result.logprobs))  # drew other than the argmax somewhere


def test_asking_changes_no_token_and_others_get_none(pipeline: CausalLMTextPipeline) -> None:
    plain = [TextItem(prompt=p, max_new_tokens=NEW_TOKENS, temperature=0.8 * (i % 2), seed=i)
             for i, p in enumerate(PROMPTS)]
    asking = [plain[0].model_copy(update={"logprobs": 2}), *plain[1:]]
    before = engine_for(pipeline).run(plain)
    after = engine_for(pipeline).run(asking)
    assert [r.text for r in after] == [r.text for r in before]
    assert after[0].logprobs is not None and len(after[0].logprobs) == NEW_TOKENS
    assert all(len(e.top_logprobs) == 2 for e in after[0].logprobs)
    assert [r.logprobs for r in after[1:]] == [None, None]


def test_scores_come_in_the_iterations_one_read(pipeline: CausalLMTextPipeline) -> None:
    items = [TextItem(prompt=p, max_new_tokens=NEW_TOKENS, logprobs=5) for p in PROMPTS]
    reads, iterations = reads_per_iteration(pipeline, items)
    assert reads == iterations
