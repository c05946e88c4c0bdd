"""Fixtures shared by every test: a real Redis of the tests' own, and the test models."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
import yaml

from services.devstack.redis_server import free_port, start_redis
from shared.jobstore import JobStore
from shared.settings import REPO_ROOT

SHARED_REDIS = "redis://127.0.0.1:6379/15"

pytest_plugins = ["tests.span_capture"]  # `exported`: spans of a test kept in memory


class RedisServer:
    """A redis-server started for the tests, which a test may restart."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = start_redis(self.port, self.workdir)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory) -> RedisServer:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    try:
        server.start()
    except RuntimeError:
        # No redis-server could be started: fall back to the machine's shared Redis, on a
        # database of its own.
        server.url = SHARED_REDIS
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server) -> str:
    with redis.Redis.from_url(redis_server.url) as r:
        r.flushdb()
    return redis_server.url


def queued(redis_url: str, model: str) -> int:
    """Sub-requests waiting in a model's queue, over all of its priority lists."""
    from shared.queue_depth import priority_lists

    with redis.Redis.from_url(redis_url) as client:
        return sum(client.llen(key) for key in priority_lists(model))


async def backlog(redis_client: aioredis.Redis, model: str) -> int:
    """The model's backlog as `fibermill_subrequests_backlog` reports it."""
    from shared.names import backlog_key

    return await redis_client.zcard(backlog_key(model))


@pytest.fixture
def sredis(redis_url):
    """A synchronous client of the test's Redis, closed after the test."""
    with redis.Redis.from_url(redis_url) as client:
        yield client


@pytest.fixture
async def aredis(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def store(aredis) -> JobStore:
    return JobStore(aredis, finished_ttl=3600)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    """The test models, built from configs (random weights), plus the committed demo models,
    and one model that raises when it runs."""
    from modelbuild.tiny_diffusion import build_tiny_sd, build_tiny_sdxl
    from modelbuild.tiny_gpt2 import build as build_tiny_gpt2

    d = tmp_path_factory.mktemp("models")
    build_tiny_gpt2(d / "tiny-gpt2")
    build_tiny_sd(d / "tiny-sd")
    build_tiny_sdxl(d / "tiny-sdxl")
    _broken_copy(d / "tiny-gpt2", d / "broken-gpt2")
    registry = yaml.safe_load((REPO_ROOT / "models" / "registry.yaml").read_text())
    for name in ("digits", "pydoc-gpt2"):  # the trained demo models are committed
        registry["models"][name]["path"] = str(REPO_ROOT / "models" / name)
    registry["models"]["broken-gpt2"] = {
        **registry["models"]["tiny-gpt2"],
        "path": "broken-gpt2",
        "description": "tiny-gpt2 whose vocabulary does not fit its tokenizer: it raises",
    }
    (d / "registry.yaml").write_text(yaml.safe_dump(registry))
    return d


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory) -> Path:
    """A Hugging Face cache holding `fibermill/tiny-chat` (modelbuild/tiny_chat.py: a Qwen2
    with a 64-token context and its chat template in the tokenizer), as the hub lays it out."""
    from modelbuild.tiny_chat import build
    from tests.hub_cache import write_hub_cache

    d = tmp_path_factory.mktemp("hub")
    build(d / "tiny-chat")
    write_hub_cache(d / "tiny-chat", d / "hf", "fibermill/tiny-chat")
    return d / "hf"


def _broken_copy(src: Path, dst: Path) -> None:
    """tiny-gpt2 with its embedding cut to 8 tokens while its tokenizer still has them all:
    loading works, and running any real prompt raises inside the model (IndexError)."""
    from transformers import AutoModelForCausalLM

    shutil.copytree(src, dst)
    model = AutoModelForCausalLM.from_pretrained(src, local_files_only=True)
    model.resize_token_embeddings(8)
    model.save_pretrained(dst)


@pytest.fixture
def settings_env(redis_url, model_dir, monkeypatch, tmp_path):
    """Point get_settings() at the test Redis and registry for in-process code."""
    from shared.settings import get_settings

    monkeypatch.setenv("FIBERMILL_REDIS_URL", redis_url)
    monkeypatch.setenv("FIBERMILL_MODEL_REGISTRY", str(model_dir / "registry.yaml"))
    monkeypatch.setenv("FIBERMILL_BLOB_DIR", str(tmp_path / "blobs"))
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def pytest_configure(config):
    # Child processes (API, workers) must not inherit a coverage or debug hook by accident.
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
