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
from services.worker.engine.results import TextResult
from services.worker.engine.scheduling import Ticket
from services.worker.engine.stopped import PipelineStopped
from services.worker.pipelines.image import StableDiffusionImagePipeline
from services.worker.pipelines.text import CausalLMTextPipeline
from shared.messages import ImageItem, TextItem
from shared.registry import ModelSpec
from tests.worker.engines import engine_for

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
        coro = self.engine.submit(item, Ticket(should_stop=should_stop))
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
    host = Host(engine_for(pipeline))
    yield host
    host.close()


@pytest.fixture(scope="module")
def image_host(model_dir):
    spec = ModelSpec(name="stress-sd", kind="stable-diffusion", path=model_dir / "tiny-sd",
                     max_batch=8, defaults={"width": 32, "height": 32, "steps": 2})
    pipeline = StableDiffusionImagePipeline(spec, CPU)
    pipeline.setup()
    host = Host(engine_for(pipeline))
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
    decoder = engine_for(pipeline).scheduling
    sequential = [engine_for(pipeline).run([item])[0] for item in TEXT_ITEMS]
    widest = 0
    original = decoder._iterate

    def iterate(admit):
        nonlocal widest
        widest = max(widest, len(decoder.running) + len(admit))
        return original(admit)

    decoder._iterate = iterate
    try:
        for _ in range(3):
            # Sampled rows too: their seeded draws lie at least 1.6e-5 from a boundary between
            # two tokens, far beyond what the batch's rounding moves (engine/decoder.py).
            for i, result in hammer(text_host, TEXT_ITEMS, PER_ROUND):
                assert result == sequential[i], TEXT_ITEMS[i]
    finally:
        del decoder._iterate
    assert widest > 1, "rows really ran together"
    assert widest <= decoder.slots, "never more rows than slots"
    assert not decoder.running and decoder.cache.used == 0


def test_image_stress_equals_the_sequential_run(image_host):
    pipeline = image_host.engine.pipeline
    # Guided and unguided items never share a batch (different keys); both kinds run.
    sequential = [pixels(engine_for(pipeline).run([item])[0].png) for item in IMAGE_ITEMS]
    count_before = batches("stress-sd")
    for _ in range(3):
        for i, result in hammer(image_host, IMAGE_ITEMS, PER_ROUND):
            assert np.abs(pixels(result.png) - sequential[i]).max() <= 1
            assert result.seed == IMAGE_ITEMS[i].seed
    assert batches("stress-sd") - count_before < 3 * PER_ROUND
    assert pipeline.pool.free_sets == pipeline.pool.pooled_sets


def stop_after(steps: int) -> Callable[[], bool]:
    seen = {"n": 0}

    def should_stop() -> bool:
        seen["n"] += 1
        return seen["n"] > steps

    return should_stop


def test_slots_under_failures_and_cancellations(model_dir):
    """A model failure in an iteration re-runs its rows alone: only the rows that fail alone
    fail; cancels end their rows; every other row succeeds, and the slots end free."""
    spec = ModelSpec(name="faults-gpt2", kind="causal-lm", path=model_dir / "tiny-gpt2",
                     max_batch=8, defaults={"max_new_tokens": 6})
    pipeline = CausalLMTextPipeline(spec, CPU)
    pipeline.setup()
    decoder = engine_for(pipeline).scheduling
    failed: list[set[str]] = []
    original = decoder._iterate

    def faulty(admit):
        held = {r.row.item.prompt for r in decoder.running} | {w.item.prompt for w in admit}
        if any(p.startswith("FAIL") for p in held):
            failed.append(held)
            raise RuntimeError("injected model failure")
        return original(admit)

    decoder._iterate = faulty
    host = Host(engine_for(pipeline))
    rng = random.Random(5)
    kinds = rng.choices(["FAIL", "CANCEL", "OK"], weights=[3, 5, 92], k=600)
    jobs = [(k, TextItem(prompt=f"{k} {i}", max_new_tokens=6)) for i, k in enumerate(kinds)]

    def one(job):
        kind, item = job
        try:
            return kind, item.prompt, host.submit(item, stop_after(2) if kind == "CANCEL" else None)
        except Exception as exc:
            return kind, item.prompt, exc

    try:
        with ThreadPoolExecutor(2 * spec.max_batch) as pool:
            outcomes = list(pool.map(one, jobs))
        in_failed = set().union(*failed)
        assert len(in_failed) > sum(k == "FAIL" for k, _ in jobs)  # failures hit neighbours
        for kind, prompt, out in outcomes:
            if kind == "FAIL":
                assert isinstance(out, RuntimeError) and "injected" in str(out), (prompt, out)
            elif kind == "CANCEL":
                assert isinstance(out, PipelineStopped), (prompt, out)
            else:
                assert out.finish_reason in ("stop", "length") and out.tokens >= 1, (prompt, out)
        assert failed and sum(isinstance(o, PipelineStopped) for _, _, o in outcomes) >= 10
        assert sum(isinstance(o, TextResult) for _, _, o in outcomes) == kinds.count("OK")
        assert not decoder.running and not decoder.waiting and decoder.cache.used == 0
    finally:
        host.close()


def test_cancelled_item_ends_at_once_while_its_batch_runs_on(text_host):
    engine = text_host.engine
    items = [TextItem(prompt=f"row {i}", max_new_tokens=8) for i in range(4)]
    alone = [engine.run([it])[0] for it in items]

    async def together():
        engine.scheduling.expected = 4
        futures = []
        for i, item in enumerate(items):
            engine.scheduling.expected -= 1
            stop = stop_after(1) if i == 2 else None
            futures.append(engine.submit(item, Ticket(should_stop=stop)))
        return await asyncio.gather(*futures, return_exceptions=True)

    results = asyncio.run_coroutine_threadsafe(together(), text_host.loop).result(60)
    assert isinstance(results[2], PipelineStopped)
    assert [results[i] for i in (0, 1, 3)] == [alone[i] for i in (0, 1, 3)]


def test_one_bad_image_item_fails_alone_and_its_batch_mates_succeed(digits_pipeline):
    """A class label the model does not have (as a crafted sub-request could carry) fails the
    batch it is in; the batch is re-run item by item and only that item fails."""
    items = [ImageItem(prompt=str(d), width=16, height=16, steps=5, guidance_scale=2.0, seed=d,
                       class_label=label) for d, label in [(1, 1), (2, 10_000), (3, 3), (4, 4)]]
    good = [items[i] for i in (0, 2, 3)]
    alone = [pixels(engine_for(digits_pipeline).run([it])[0].png) for it in good]
    host = Host(engine_for(digits_pipeline))
    isolated = metrics.BATCHES_ISOLATED.labels("digits")._value.get()
    try:
        async def together():
            engine = host.engine
            engine.scheduling.expected = len(items)  # one batch: all announced before any runs
            futures = []
            for it in items:
                engine.scheduling.expected -= 1
                futures.append(engine.submit(it))
            return await asyncio.gather(*futures, return_exceptions=True)

        results = asyncio.run_coroutine_threadsafe(together(), host.loop).result(120)
    finally:
        host.close()
    assert isinstance(results[1], ValueError) and "class label" in str(results[1])
    for got, want in zip((results[0], results[2], results[3]), alone, strict=True):
        assert np.abs(pixels(got.png) - want).max() <= 1
    assert metrics.BATCHES_ISOLATED.labels("digits")._value.get() == isolated + 1
