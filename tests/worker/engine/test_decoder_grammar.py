"""Structured output in the continuous decoder: rows under a `response_format` write JSON that
parses and validates whatever the model's weights (tiny-gpt2's are random) and however short
their budget, beside unconstrained rows whose tokens do not change; the masks are filled off
the device thread, and an iteration still reads the host once."""

import json
import threading
from pathlib import Path

import jsonschema
import pytest
import torch

from services.worker.engine import decoder as decoder_module
from services.worker.pipelines.text import CausalLMTextPipeline
from shared.messages import ResponseFormat, TextItem
from shared.registry import ModelKind, ModelSpec
from tests.worker.engine.test_grammar import SCHEMA
from tests.worker.engines import engine_for
from tests.worker.text_reference import alone, reads_per_iteration

JSON_MODE = ResponseFormat(type="json_object")
WITH_SCHEMA = ResponseFormat(type="json_schema", json_schema=SCHEMA)


@pytest.fixture(scope="module")
def pipeline(model_dir: Path) -> CausalLMTextPipeline:
    spec = ModelSpec(name="tiny-gpt2-grammar", kind=ModelKind.CAUSAL_LM,
                     path=model_dir / "tiny-gpt2")
    pipe = CausalLMTextPipeline(spec, torch.device("cpu"))
    pipe.setup()
    return pipe


def _items(fmt: ResponseFormat, budgets: list[int]) -> list[TextItem]:
    return [TextItem(prompt=f"Describe person {i} as JSON:", max_new_tokens=budget,
                     temperature=0.0 if i % 2 else 1.3, seed=i, response_format=fmt)
            for i, budget in enumerate(budgets)]


@pytest.mark.parametrize("fmt", [JSON_MODE, WITH_SCHEMA], ids=["json_object", "json_schema"])
def test_constrained_rows_write_json_that_validates_within_any_budget(
        pipeline: CausalLMTextPipeline, fmt: ResponseFormat) -> None:
    budgets = [40, 64, 96, 128, 40, 64, 96, 128]
    for result in engine_for(pipeline).run(_items(fmt, budgets)):
        value = json.loads(result.text)
        assert isinstance(value, dict)
        if fmt.json_schema is not None:
            jsonschema.validate(value, fmt.json_schema)


def test_unconstrained_rows_beside_them_keep_their_tokens(pipeline: CausalLMTextPipeline):
    plain = [TextItem(prompt=p, max_new_tokens=12, temperature=0.7 * i, seed=i)
             for i, p in enumerate(["Hello there", "def split(items):", "The sky"])]
    reference = alone(pipeline, plain)
    mixed = plain + _items(WITH_SCHEMA, [48, 48])
    results = engine_for(pipeline).run(mixed)
    assert results[:3] == reference
    for result in results[3:]:
        jsonschema.validate(json.loads(result.text), SCHEMA)


def test_masks_are_filled_off_the_device_thread(pipeline: CausalLMTextPipeline,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    threads: set[int] = set()
    fill = decoder_module.fill_masks

    def recording(bitmask, rows):
        threads.add(threading.get_ident())
        return fill(bitmask, rows)

    monkeypatch.setattr(decoder_module, "fill_masks", recording)
    engine_for(pipeline).run(_items(JSON_MODE, [24]))
    device = pipeline.device_executor.submit(threading.get_ident).result()
    assert threads and device not in threads


def test_an_iteration_still_reads_the_host_once(pipeline: CausalLMTextPipeline) -> None:
    reads, iterations = reads_per_iteration(pipeline, _items(WITH_SCHEMA, [32, 32]))
    assert reads == iterations


def test_stop_strings_do_not_cut_a_structured_answer(pipeline: CausalLMTextPipeline) -> None:
    item = TextItem(prompt="JSON:", max_new_tokens=40, stop=['"', ":"],
                    response_format=WITH_SCHEMA)
    jsonschema.validate(json.loads(engine_for(pipeline).run([item])[0].text), SCHEMA)
