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
    assert e["param"] == "size"
    # The same request on Fibermill's own route keeps its 422 and its shape.
    own = client.post("/v1/jobs", json={"model": "digits", "input": {"prompts": ["7"],
                                                                     "width": 512}})
    assert own.status_code == 422 and own.json()["detail"][0]["loc"] == ["body", "input",
                                                                         "width"]


def test_a_body_that_is_not_json_names_no_field_and_says_where_it_breaks(client):
    body = b'{"model": "tiny-gpt2",\n  "prompt": "x",\n  max_tokens: 4}'
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/images/generations"):
        e = _error(client.post(path, content=body,
                               headers={"content-type": "application/json"}), 400)
        # pydantic's location of it is the character it broke at (42), not a field.
        assert e["param"] is None, path
        assert e["message"].startswith("the request body is not valid JSON: "), e
        assert "line 3, column 3" in e["message"], e
        assert e["type"] == "invalid_request_error" and "42" not in e["message"]


def test_a_size_the_model_does_not_make_is_one_problem_in_its_own_words(client):
    e = _error(client.post("/v1/images/generations", json={"model": "digits", "prompt": "7",
                                                           "size": "512x512"}), 400)
    # One problem, not the width's and the height's, in WxH and not in one side's pixels.
    assert e["param"] == "size" and e["message"].count("size") == 1, e
    assert e["message"] == "size: model digits makes only 16x16 images (or auto), not 512x512"
    e = _error(client.post("/v1/images/generations", json={"model": "tiny-sd", "prompt": "x",
                                                           "size": "36x512", "n": 9}), 400)
    assert e["message"].count("size: ") == 1 and "36x512" in e["message"], e
    assert "32x32 to 256x256" in e["message"] and "n: " in e["message"]  # the rest still said
    ok = client.post("/v1/images/generations", json={"model": "digits", "prompt": "7",
                                                     "size": "16x16", "n": 11})
    assert _error(ok, 400)["param"] == "n"  # a size it makes is not named


def test_the_model_routes_answer_in_both_apis_shapes(client):
    missing = client.get("/v1/models/nope")
    assert missing.status_code == 404
    body = missing.json()
    # OpenAI's clients read `error`; Fibermill's read `detail` and `code`, as before.
    assert body["error"] == {"message": "model 'nope' not found",
                             "type": "invalid_request_error", "param": "model",
                             "code": "model_not_found"}
    assert body["detail"] == "model 'nope' not found" and body["code"] == "model_not_found"
    for path in ("/v1/models", "/v1/models/tiny-gpt2"):
        refused = client.get(path, headers={"Authorization": "Bearer wrong"})
        assert refused.status_code == 401 and refused.json()["code"] == "unauthorized"
        assert refused.json()["error"]["code"] == "invalid_api_key"
    assert client.get("/v1/models/tiny-gpt2").json()["id"] == "tiny-gpt2"
