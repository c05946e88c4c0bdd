"""One engine (batcher + operator graph + buffer pool) driven from many threads at once, as the
worker's Celery threads drive it: outputs, failures, cancellations and the pool's books."""

import asyncio
import io
import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from PIL import Image

from services.worker import metrics
from services.worker.engine.engine import Engine
from services.worker.engine.graph import Graph
from services.worker.engine.operator import Operator
from services.worker.pipelines.image import StableDiffusionImagePipeline
from services.worker.pipelines.stopped import PipelineStopped
from services.worker.pipelines.text import CausalLMTextPipeline
from shared.messages import ImageItem, TextItem
from shared.registry import ModelSpec

CPU = torch.device("cpu")
THREADS = 8
PER_ROUND = 200


class Host:
    """An engine on its own event loop thread, submitted to from any thread (as the worker)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def submit(self, item, should_stop=None):
        coro = self.engine.submit(item, should_stop)
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=300)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def batches(model: str) -> float:
    """How many batches `model` has run."""
    return sum(b.get() for b in metrics.BATCH_SIZE.labels(model)._buckets)


def pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png))).astype(int)


def hammer(host: Host, items: list, n: int, threads: int = THREADS) -> list[tuple[int, object]]:
    """`n` sub-requests of random items from `threads` threads; returns (item index, result)."""
    rng = random.Random(n)
    picks = [rng.randrange(len(items)) for _ in range(n)]

    def one(i: int):
        return i, host.submit(items[i])

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, picks))


@pytest.fixture(scope="module")
def text_host(model_dir):
    spec = ModelSpec(name="stress-gpt2", kind="causal-lm", path=model_dir / "tiny-gpt2",
                     max_batch=8, defaults={"max_new_tokens": 8})
    pipeline = CausalLMTextPipeline(spec, CPU)
    pipeline.setup()
    host = Host(Engine(pipeline))
    yield host
    host.close()


@pytest.fixture(scope="module")
def image_host(model_dir):
    spec = ModelSpec(name="stress-sd", kind="stable-diffusion", path=model_dir / "tiny-sd",
                     max_batch=8, defaults={"width": 32, "height": 32, "steps": 2})
    pipeline = StableDiffusionImagePipeline(spec, CPU)
    pipeline.setup()
    host = Host(Engine(pipeline))
    yield host
    host.close()


TEXT_ITEMS = [
    TextItem(prompt=p, max_new_tokens=n, temperature=t, seed=s)
    for p, n, t, s in [
        ("Hello", 8, 0.0, 0), ("The quick brown fox jumps over", 5, 0.0, 0),
        ("Return a new list", 8, 0.9, 1), ("A", 3, 0.0, 0), ("If the value is", 8, 1.2, 7),
        ("Split the string at every comma", 6, 0.0, 0), ("x", 1, 0.0, 0), ("", 4, 0.7, 3),
    ]
]
IMAGE_ITEMS = [
    ImageItem(prompt=p, width=32, height=32, steps=2, guidance_scale=g, seed=s)
    for p, g, s in [("a red cube", 7.5, 1), ("a blue ball", 7.5, 2), ("a cat", 1.0, 3),
                    ("seven green dogs", 7.5, 4), ("", 7.5, 5), ("a house", 1.0, 6)]
]


def test_text_stress_equals_the_sequential_run(text_host):
    pipeline = text_host.engine.pipeline
    sequential = [pipeline.run([item])[0] for item in TEXT_ITEMS]
    count_before = batches("stress-gpt2")
    for _ in range(3):
        for i, result in hammer(text_host, TEXT_ITEMS, PER_ROUND):
            assert result == sequential[i]
    assert batches("stress-gpt2") - count_before < 3 * PER_ROUND  # they really were batched
    assert pipeline.pool.free_sets == pipeline.pool.pooled_sets


def test_image_stress_equals_the_sequential_run(image_host):
    pipeline = image_host.engine.pipeline
    # Guided and unguided items never share a batch (different keys); both kinds run.
    sequential = [pixels(pipeline.run([item])[0].png) for item in IMAGE_ITEMS]
    count_before = batches("stress-sd")
    for _ in range(3):
        for i, result in hammer(image_host, IMAGE_ITEMS, PER_ROUND):
            assert np.abs(pixels(result.png) - sequential[i]).max() <= 1
            assert result.seed == IMAGE_ITEMS[i].seed
    assert batches("stress-sd") - count_before < 3 * PER_ROUND
    assert pipeline.pool.free_sets == pipeline.pool.pooled_sets


class Faulty(Operator):
    """Wraps a graph's operator: fails every batch holding a FAIL item, and records batches."""

    def __init__(self, inner: Operator, failed: list) -> None:
        self.inner = inner
        self.name = inner.name
        self.executor = inner.executor
        self.input_type = inner.input_type
        self.output_type = inner.output_type
        self.failed = failed

    def can_operate(self, value, batch):
        return self.inner.can_operate(value, batch)

    def run(self, value, batch):
        prompts = [item.prompt for item in batch.items]
        if any(p.startswith("FAIL") for p in prompts):
            self.failed.append(prompts)
            raise RuntimeError("injected operator failure")
        return self.inner.run(value, batch)


def with_faults(pipeline, op_name: str, failed: list) -> None:
    ops = [Faulty(op, failed) if name == op_name else op
           for name, op in pipeline.graph.operators.items()]
    pipeline.graph = Graph(ops, pipeline.graph.router)


def stop_after(steps: int) -> Callable[[], bool]:
    seen = {"n": 0}

    def should_stop() -> bool:
        seen["n"] += 1
        return seen["n"] > steps

    return should_stop


def test_pool_invariants_under_failures_and_cancellations(model_dir):
    # One set per bucket, so two batches in flight in one bucket need an ad-hoc set.
    spec = ModelSpec(name="faults-gpt2", kind="causal-lm", path=model_dir / "tiny-gpt2",
                     max_batch=8, pool_sets=1, defaults={"max_new_tokens": 6})
    pipeline = CausalLMTextPipeline(spec, CPU)
    pipeline.setup()
    failed: list[list[str]] = []
    with_faults(pipeline, "prefill", failed)
    pooled_before = pipeline.pool.pooled_sets
    host = Host(Engine(pipeline))
    rng = random.Random(5)
    kinds = rng.choices(["FAIL", "CANCEL", "OK"], weights=[10, 5, 85], k=1000)
    jobs = [(k, TextItem(prompt=f"{k} {i}", max_new_tokens=6)) for i, k in enumerate(kinds)]

    def one(job):
        kind, item = job
        try:
            return kind, item.prompt, host.submit(item, stop_after(2) if kind == "CANCEL" else None)
        except Exception as exc:
            return kind, item.prompt, exc

    def run_all(threads: int, subset):
        with ThreadPoolExecutor(threads) as pool:
            return list(pool.map(one, subset))

    adhoc = metrics.BUFFER_LEASES.labels("faults-gpt2", "adhoc")
    try:
        # As many threads as a worker holds (2 x max_batch): a full batch runs beside another.
        outcomes = run_all(2 * spec.max_batch, jobs)
        in_failed_batch = {p for batch in failed for p in batch}
        for kind, prompt, out in outcomes:
            if prompt in in_failed_batch:
                # A failing batch fails exactly its own sub-requests...
                assert isinstance(out, RuntimeError) and "injected" in str(out), (prompt, out)
            elif kind == "CANCEL":
                assert isinstance(out, PipelineStopped), (prompt, out)
            else:
                # ...and every other one succeeds.
                assert out.finish_reason in ("stop", "length") and out.tokens >= 1, (prompt, out)
        assert failed and sum(isinstance(o, RuntimeError) for _, _, o in outcomes) >= 100
        # (a cancel in a batch that fails first gets the failure)
        assert sum(isinstance(o, PipelineStopped) for _, _, o in outcomes) >= 10
        # The books: every pooled set is back, every ad-hoc set freed, the pool did not grow.
        assert pipeline.pool.free_sets == pipeline.pool.pooled_sets == pooled_before
        assert pipeline.pool.adhoc_live == 0
        assert adhoc._value.get() > 0  # the ad-hoc path was exercised

        # With no more concurrency than the pool has sets, no ad-hoc set at all.
        before = adhoc._value.get()
        outcomes = run_all(1, jobs[:200])
        assert adhoc._value.get() == before
        assert pipeline.pool.free_sets == pooled_before and pipeline.pool.adhoc_live == 0
    finally:
        host.close()


def test_cancelled_item_ends_at_once_while_its_batch_runs_on(text_host):
    engine = text_host.engine
    items = [TextItem(prompt=f"row {i}", max_new_tokens=8) for i in range(4)]
    alone = [engine.pipeline.run([it])[0] for it in items]

    async def together():
        engine.batcher.expected = 4
        futures = []
        for i, item in enumerate(items):
            engine.batcher.expected -= 1
            futures.append(engine.submit(item, stop_after(1) if i == 2 else None))
        return await asyncio.gather(*futures, return_exceptions=True)

    results = asyncio.run_coroutine_threadsafe(together(), text_host.loop).result(60)
    assert isinstance(results[2], PipelineStopped)
    assert [results[i] for i in (0, 1, 3)] == [alone[i] for i in (0, 1, 3)]
