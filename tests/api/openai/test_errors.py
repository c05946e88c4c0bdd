"""On the OpenAI paths every error is OpenAI's body, with OpenAI's statuses; Fibermill's own
routes keep theirs. No worker is needed: these are refused before a job exists."""

import pytest
from fastapi.testclient import TestClient

from services.api.app import create_app
from shared.settings import get_settings

KEY = "fm-test-openai-key"
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def client(settings_env, monkeypatch):
    monkeypatch.setenv("FIBERMILL_API_KEYS", KEY)
    get_settings.cache_clear()
    with TestClient(create_app(), headers={"Authorization": f"Bearer {KEY}"}) as c:
        yield c


def _error(r, status: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_a_missing_key_is_openais_401_there_and_fibermills_elsewhere(client):
    e = _error(client.post("/v1/completions", json={"model": "tiny-gpt2", "prompt": "x"},
                           headers={"Authorization": ""}), 401)
    assert e["code"] == "invalid_api_key" and KEY not in e["message"]
    own = client.get("/v1/jobs", headers={"Authorization": ""})
    assert own.status_code == 401 and own.json()["code"] == "unauthorized"


def test_a_body_that_is_not_a_request_is_400_naming_the_field(client):
    e = _error(client.post("/v1/chat/completions", content=b"{not json",
                           headers={"content-type": "application/json"}), 400)
    assert e["type"] == "invalid_request_error"
    e = _error(client.post("/v1/chat/completions", json={"model": "pydoc-gpt2"}), 400)
    assert e["param"] == "messages" and "required" in e["message"]
    e = _error(client.post("/v1/chat/completions", json={
        "model": "pydoc-gpt2", "messages": MESSAGES, "n": 0, "temperature": 9}), 400)
    assert e["param"] == "temperature" and "n: " in e["message"]  # every problem at once


def test_limits_and_models_are_named(client):
    e = _error(client.post("/v1/completions", json={"model": "nope", "prompt": "x"}), 404)
    assert e["code"] == "model_not_found" and e["param"] == "model"
    e = _error(client.post("/v1/completions", json={"model": "tiny-gpt2", "prompt": "x",
                                                    "max_tokens": 100_000}), 400)
    assert e["param"] == "max_tokens" and "256" in e["message"]
    e = _error(client.post("/v1/images/generations", json={"model": "digits", "prompt": "7",
                                                           "size": "512x512"}), 400)
    assert e["param"] == "size" and "16" in e["message"]
    # The same request on Fibermill's own route keeps its 422 and its shape.
    own = client.post("/v1/jobs", json={"model": "digits", "input": {"prompts": ["7"],
                                                                     "width": 512}})
    assert own.status_code == 422 and own.json()["detail"][0]["loc"] == ["body", "input",
                                                                         "width"]
