"""The benchmarks' local stack: up, serving, each process leading its own group, and gone after;
a stack that cannot come up says why."""

import os

import httpx
import pytest

from benchmarks.stack import bench_stack


def test_a_stack_serves_jobs_and_its_processes_are_gone_after(model_dir, tmp_path):
    env = {"FIBERMILL_MODEL_REGISTRY": str(model_dir / "registry.yaml")}
    with bench_stack("tiny-gpt2", env=env, logdir=tmp_path) as stack:
        body = {"task": "text-generation", "model": "tiny-gpt2",
                "input": {"prompts": ["Hello"], "max_new_tokens": 2}}
        job = httpx.post(f"{stack.url}/v1/jobs", json=body, headers={"Prefer": "wait=30"},
                         timeout=60).json()
        assert job["status"] == "succeeded", job
        assert "fibermill_worker_subrequests_total" in httpx.get(stack.metrics_url).text
        # processes.frozen stops a whole group: each must lead its own.
        assert all(os.getpgid(p.pid) == p.pid for p in stack.procs)
        procs = stack.procs
    assert all(p.poll() is not None for p in procs)


def test_a_stack_that_does_not_come_up_shows_its_logs(model_dir, tmp_path):
    env = {"FIBERMILL_MODEL_REGISTRY": str(model_dir / "registry.yaml")}
    with pytest.raises(RuntimeError, match="no-such-model"), \
            bench_stack("no-such-model", env=env, logdir=tmp_path):
        pass
