"""End to end: REST -> Redis/Celery -> two worker processes -> joined results."""

import io
import os
import signal
import time

import numpy as np
import pytest
import torch
from PIL import Image

from shared import names
from shared.jobstore import attempts_in, lease_owners_in

pytestmark = pytest.mark.e2e

TEXT_PROMPTS = ["Hello there!", "The sun", "A", "The dog barked at"]


def _png(stack, job_id: str, index: int) -> bytes:
    r = stack.http.get(f"/v1/jobs/{job_id}/outputs/{index}")
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    return r.content


def test_text_job_joins_in_input_order_across_both_workers(stack):
    submitted = stack.submit({"task": "text-generation", "model": "tiny-gpt2",
                              "input": {"prompts": TEXT_PROMPTS, "max_new_tokens": 6}})
    job = stack.wait(submitted["id"], client=stack.other)  # read from the other API replica
    assert job["status"] == "succeeded", job
    assert job["progress"] == {"done": 4, "total": 4}
    assert job["started_at"] and job["completed_at"] and job["metrics"]["run_seconds"] >= 0
    outs = job["output"]
    assert len(outs) == 4
    # Each output equals the same prompt run alone (greedy), so they are in input order.
    for prompt, out in zip(TEXT_PROMPTS, outs, strict=True):
        alone = stack.run({"task": "text-generation", "model": "tiny-gpt2",
                           "input": {"prompts": [prompt], "max_new_tokens": 6}})
        assert alone["output"][0]["text"] == out["text"]
        assert out["finish_reason"] in ("stop", "length") and out["tokens"] >= 1
    # Sub-requests are spread over the two worker processes; try a few jobs to see both.
    workers = {o["worker"] for o in outs}
    for _ in range(5):
        if len(workers) >= 2:
            break
        again = stack.run({"task": "text-generation", "model": "tiny-gpt2",
                           "input": {"prompts": TEXT_PROMPTS, "max_new_tokens": 6}})
        workers |= {o["worker"] for o in again["output"]}
    assert len(workers) == 2, workers


def _pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png))).astype(int)


def test_image_job_sizes_order_and_reproducibility(stack):
    job = stack.run({"task": "image-generation", "model": "tiny-sd",
                     "input": {"prompts": ["a red cube", "a blue ball"],
                               "num_images_per_prompt": 2, "seed": 11,
                               "width": 64, "height": 48, "steps": 3}})
    assert job["status"] == "succeeded", job
    outs = job["output"]
    assert [o["seed"] for o in outs] == [11, 12, 13, 14]
    pngs = [_png(stack, job["id"], i) for i in range(4)]
    for png in pngs:
        assert Image.open(io.BytesIO(png)).size == (64, 48)
    # Image 3 (second image of the second prompt, seed 14) equals that prompt alone, to the
    # rounding the engine's batched-equals-alone tests allow (a batch of 3 or 4 can round one
    # channel differently on the CPU: its matrix products are blocked by batch size).
    alone = stack.run({"task": "image-generation", "model": "tiny-sd",
                       "input": {"prompts": ["a blue ball"], "seed": 14,
                                 "width": 64, "height": 48, "steps": 3}})
    assert np.abs(_pixels(_png(stack, alone["id"], 0)) - _pixels(pngs[3])).max() <= 1
    assert np.abs(_pixels(pngs[0]) - _pixels(pngs[1])).max() > 1


def test_digits_job_matches_contract_example(stack):
    job = stack.run({"task": "image-generation", "model": "digits",
                     "input": {"prompts": ["7", "a handwritten three"],
                               "num_images_per_prompt": 2, "seed": 1}})
    assert job["status"] == "succeeded", job
    assert job["progress"] == {"done": 4, "total": 4}
    for i, out in enumerate(job["output"]):
        assert out["url"].endswith(f"/v1/jobs/{job['id']}/outputs/{i}")
        assert Image.open(io.BytesIO(_png(stack, job["id"], i))).size == (16, 16)


def test_sdxl_job(stack):
    job = stack.run({"task": "image-generation", "model": "tiny-sdxl",
                     "input": {"prompts": ["x"], "width": 64, "height": 64, "steps": 2}})
    assert job["status"] == "succeeded", job


def test_model_that_raises_fails_the_job_and_worker_keeps_serving(stack):
    job = stack.run({"task": "text-generation", "model": "broken-gpt2",
                     "input": {"prompts": ["boom"], "max_new_tokens": 4}})
    assert job["status"] == "failed"
    assert job["error"]["code"] == "model_error"
    assert "IndexError" in job["error"]["message"]
    after = stack.run({"task": "text-generation", "model": "tiny-gpt2",
                       "input": {"prompts": ["still alive"], "max_new_tokens": 3}})
    assert after["status"] == "succeeded"


def test_sigkilled_worker_loses_nothing(stack):
    # Long enough on CPU that the kill lands while the sub-requests run.
    job = stack.submit({"task": "image-generation", "model": "digits",
                        "input": {"prompts": ["4", "5"], "steps": 800, "seed": 3}})
    deadline = time.time() + 60
    running = {}
    while time.time() < deadline and not running:
        raw = stack.redis.hgetall(names.job_key(job["id"]))
        # Started on the device: an attempt is charged only then (a leased sub-request may
        # still be waiting in its worker's batcher).
        charged = {i for i, n in attempts_in(raw).items() if n >= 1}
        running = {i: o for i, o in lease_owners_in(raw).items() if i in charged}
        time.sleep(0.02)
    assert running, "no sub-request of the job started"
    victim = int(next(iter(running.values())).rsplit("/", 1)[1])
    os.kill(victim, signal.SIGKILL)
    final = stack.wait(job["id"], timeout=180)
    assert final["status"] == "succeeded", (final, stack.logs())
    assert len(final["output"]) == 2 and all(final["output"])
    assert stack.redis.hlen(names.results_key(job["id"])) == 2
    entries = stack.redis.xrange(names.COMPLETIONS_STREAM)
    indices = [f[b"index"] for _id, f in entries
               if f[b"job"].decode() == job["id"] and f[b"kind"] == b"result"]
    # Each index completed at most once: the joiner trims the entries it has joined, so some
    # may be gone by now, but none may be there twice.
    assert len(indices) == len(set(indices)) and set(indices) <= {b"0", b"1"}
    # The killed sub-request ran on another worker after it, as a second attempt.
    assert max(attempts_in(stack.redis.hgetall(names.job_key(job["id"]))).values()) >= 2


def test_models_lists_live_workers(stack):
    models = {m["name"]: m for m in stack.http.get("/v1/models").json()["models"]}
    assert {"digits", "tiny-gpt2", "tiny-sd", "tiny-sdxl"} <= set(models)
    assert models["digits"]["task"] == "image-generation"
    assert len(models["tiny-gpt2"]["workers"]) >= 1 and models["tiny-gpt2"]["available"]


def test_image_job_split_over_both_workers_equals_one_batch_on_one_worker(stack, model_dir):
    from services.worker.engine.engine import Engine
    from services.worker.pipelines.image import StableDiffusionImagePipeline
    from shared.inputs import ImageGenerationInput
    from shared.registry import load_registry
    from shared.subrequest import split_items

    prompts = ["a red cube", "a blue ball", "a cat", "seven green dogs"]
    raw = {"prompts": prompts, "seed": 21, "width": 64, "height": 64, "steps": 3}
    body = {"task": "image-generation", "model": "tiny-sd", "input": raw}
    for _ in range(6):  # until the sub-requests landed on both worker processes
        job = stack.run(body)
        assert job["status"] == "succeeded", job
        if len({o["worker"] for o in job["output"]}) == 2:
            break
    assert len({o["worker"] for o in job["output"]}) == 2
    spec = load_registry(model_dir / "registry.yaml").get("tiny-sd")
    pipeline = StableDiffusionImagePipeline(spec, torch.device("cpu"))
    pipeline.setup()
    # The same items as one batch of four in this process: what a single worker would make.
    items = split_items(spec, ImageGenerationInput.model_validate(raw), seed=21)
    for i, one_worker in enumerate(Engine(pipeline).run(items)):
        split = np.asarray(Image.open(io.BytesIO(_png(stack, job["id"], i)))).astype(int)
        alone = np.asarray(Image.open(io.BytesIO(one_worker.png))).astype(int)
        assert np.abs(split - alone).max() <= 1, i
