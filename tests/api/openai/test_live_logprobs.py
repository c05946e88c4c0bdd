"""Log-probabilities from a real worker through the OpenAI routes, answered whole and streamed:
one entry per generated token (as many as the usage counts), each with the asked alternatives,
most likely first."""

import json

import pytest
from fastapi.testclient import TestClient

from services.api.app import create_app
from shared.settings import get_settings
from tests.api.worker_process import wait_until_ready, worker_process

KEY = "fm-test-live-logprobs"
MESSAGES = [{"role": "user", "content": "Return the number of items."}]


@pytest.fixture
def client(settings_env, monkeypatch, redis_url, model_dir, tmp_path):
    monkeypatch.setenv("FIBERMILL_API_KEYS", KEY)
    get_settings.cache_clear()
    log = tmp_path / "workers.log"
    with TestClient(create_app(), headers={"Authorization": f"Bearer {KEY}"}) as c, \
            worker_process(redis_url, model_dir, tmp_path / "blobs", "pydoc-gpt2,tiny-gpt2",
                           log) as proc:
        wait_until_ready(c, proc, log)
        yield c


def _streamed(client: TestClient, path: str, body: dict) -> list[dict]:
    with client.stream("POST", path, json={**body, "stream": True,
                                           "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200
        data = [line.removeprefix("data: ") for line in r.iter_lines()
                if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def _check_chat(content: list[dict], text: str, completion_tokens: int) -> None:
    assert len(content) == completion_tokens > 0
    for entry in content:
        assert list(entry) == ["token", "logprob", "bytes", "top_logprobs"]
        top = entry["top_logprobs"]
        assert len(top) == 2 and all(list(t) == ["token", "logprob", "bytes"] for t in top)
        assert top[0]["logprob"] >= top[1]["logprob"]
        assert entry["logprob"] <= top[0]["logprob"] <= 0
    assert "".join(e["token"] for e in content).startswith(text[:1])


def test_chat_logprobs_whole_and_streamed(client):
    body = {"model": "pydoc-gpt2", "messages": MESSAGES, "max_tokens": 8, "logprobs": True,
            "top_logprobs": 2}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    answer = r.json()
    choice = answer["choices"][0]
    assert set(choice["logprobs"]) == {"content", "refusal"}
    _check_chat(choice["logprobs"]["content"], choice["message"]["content"],
                answer["usage"]["completion_tokens"])

    chunks = _streamed(client, "/v1/chat/completions", body)
    content = [e for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
               for e in c["choices"][0]["logprobs"]["content"]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    _check_chat(content, text, chunks[-1]["usage"]["completion_tokens"])


def _check_completion(lp: dict, text: str, completion_tokens: int) -> None:
    assert list(lp) == ["tokens", "token_logprobs", "top_logprobs", "text_offset"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(
        lp["text_offset"]) == completion_tokens > 0
    for token, logprob, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"],
                                   strict=True):
        # The 2 most likely, and the chosen one beside them when it is not among them; only
        # tokens that read alike (bytes of a split character, read as U+FFFD) share a key.
        assert token in top and top[token] >= logprob and len(top) <= 3
        if not any("\ufffd" in key for key in top):
            assert len(top) >= 2
        best = max(top.values())
        assert logprob <= best <= 0
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    assert all(o <= len(text) for o in lp["text_offset"])


def test_completion_logprobs_whole_and_streamed(client):
    body = {"model": "tiny-gpt2", "prompt": "Return the", "max_tokens": 8, "logprobs": 2}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    answer = r.json()
    choice = answer["choices"][0]
    _check_completion(choice["logprobs"], choice["text"], answer["usage"]["completion_tokens"])

    chunks = _streamed(client, "/v1/completions", body)
    pieces = [c["choices"][0]["logprobs"] for c in chunks
              if c["choices"] and c["choices"][0]["logprobs"]]
    joined = {k: [v for p in pieces for v in p[k]] for k in pieces[0]}
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    _check_completion(joined, text, chunks[-1]["usage"]["completion_tokens"])
