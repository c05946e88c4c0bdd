"""A decoder iteration that fails: its rows run again alone, once; out of memory alone is named
as such; a sticky device error runs nothing again (engine/device_faults.py)."""

import asyncio
from pathlib import Path

import pytest
import torch

from services.worker.engine.decoder import Decoder
from services.worker.engine.device_faults import DeviceLost, OutOfDeviceMemory
from services.worker.engine.engine import Engine
from services.worker.pipelines.text import CausalLMTextPipeline
from shared.messages import TextItem
from shared.registry import ModelKind, ModelSpec

PROMPTS = ["Hello there", "The quick brown fox", "Return a new list", "If the", "This function"]


@pytest.fixture(scope="module")
def pipeline(model_dir: Path) -> CausalLMTextPipeline:
    spec = ModelSpec(name="tiny-gpt2-failures", kind=ModelKind.CAUSAL_LM,
                     path=model_dir / "tiny-gpt2")
    pipe = CausalLMTextPipeline(spec, torch.device("cpu"))
    pipe.load()
    pipe.prepare()
    return pipe


class Poisoned:
    """The pipeline's forward, raising `error` whenever `poison` is among the running rows:
    its prefill runs, its first decode step fails."""

    def __init__(self, pipe: CausalLMTextPipeline, poison: TextItem, error: Exception) -> None:
        self.forward = pipe.forward
        self.poison = poison
        self.error = error
        self.raised = 0
        self.decoder: Decoder | None = None

    def __call__(self, *args, **kwargs):
        assert self.decoder is not None
        if any(r.waiting.item is self.poison for r in self.decoder.running):
            self.raised += 1
            if self.raised > 50:  # the bug this guards against: stop before the test hangs
                raise AssertionError("the poisoned row ran again without end")
            raise self.error
        return self.forward(*args, **kwargs)


def _together(engine: Engine, items: list[TextItem]) -> list:
    """The items admitted in one prefill, as a burst announced together is."""

    async def run():
        engine.scheduling.expected = len(items)
        futures = []
        for item in items:
            engine.scheduling.expected -= 1
            futures.append(engine.submit(item))
        return await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 30)

    return asyncio.run(run())


def _run(pipe: CausalLMTextPipeline, poison_error: Exception,
         monkeypatch: pytest.MonkeyPatch) -> tuple[list, list, Poisoned, int]:
    items = [TextItem(prompt=p, max_new_tokens=6) for p in PROMPTS]
    poison = items[2]
    reference = Engine(pipe).run([i for i in items if i is not poison])
    engine = Engine(pipe)
    poisoned = Poisoned(pipe, poison, poison_error)
    poisoned.decoder = engine.scheduling
    iterations = 0
    iterate = engine.scheduling._iterate

    def counting(admit):
        nonlocal iterations
        iterations += 1
        return iterate(admit)

    monkeypatch.setattr(engine.scheduling, "_iterate", counting)
    monkeypatch.setattr(pipe, "forward", poisoned)
    results = _together(engine, items)
    return results, reference, poisoned, iterations


def test_a_row_failing_after_its_prefill_fails_alone_after_one_retry(
        pipeline: CausalLMTextPipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    results, reference, poisoned, iterations = _run(pipeline, RuntimeError("injected"),
                                                    monkeypatch)
    assert isinstance(results[2], RuntimeError) and str(results[2]) == "injected"
    assert [*results[:2], *results[3:]] == reference
    assert poisoned.raised == 2  # with the others, then alone
    # One together, then each row alone: at most two iterations each for 6 tokens.
    assert iterations <= 1 + 2 * len(PROMPTS)


@pytest.mark.parametrize("error", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't "
                 "allocate memory: you tried to allocate 68719476736 bytes."),
])
def test_a_row_out_of_memory_alone_fails_as_such_and_the_others_run(
        pipeline: CausalLMTextPipeline, monkeypatch: pytest.MonkeyPatch,
        error: Exception) -> None:
    results, reference, poisoned, _ = _run(pipeline, error, monkeypatch)
    assert isinstance(results[2], OutOfDeviceMemory)
    assert results[2].code == "out_of_memory" and results[2].__cause__ is error
    assert [*results[:2], *results[3:]] == reference
    assert poisoned.raised == 2


def test_a_sticky_device_error_runs_nothing_again(
        pipeline: CausalLMTextPipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    error = RuntimeError("CUDA error: an illegal memory access was encountered")
    results, _, poisoned, iterations = _run(pipeline, error, monkeypatch)
    assert all(isinstance(r, DeviceLost) and r.__cause__ is error for r in results)
    assert poisoned.raised == 1 and iterations == 1
