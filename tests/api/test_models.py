"""GET /v1/models: each model lists its own task's parameters, with its own bounds and
defaults, and those bounds are the ones the API enforces."""

import pytest
from fastapi.testclient import TestClient

from services.api.app import create_app
from shared.registry import load_registry


@pytest.fixture
def client(settings_env):
    with TestClient(create_app()) as c:
        yield c


@pytest.fixture
def models(client) -> dict[str, dict]:
    return {m["name"]: m for m in client.get("/v1/models").json()["models"]}


def test_a_text_model_lists_only_text_parameters(models, model_dir):
    spec = load_registry(model_dir / "registry.yaml").get("tiny-gpt2")
    gpt2 = models["tiny-gpt2"]
    assert set(gpt2["parameters"]) == {"prompts", "seed", "max_new_tokens", "temperature",
                                       "top_p", "top_k", "stop", "stream", "logprobs",
                                       "response_format"}
    assert gpt2["parameters"]["max_new_tokens"] | {"description": ""} == {
        "type": "integer", "minimum": 1, "maximum": spec.limits.max_new_tokens,
        "default": spec.defaults.max_new_tokens, "description": ""}
    assert set(gpt2["defaults"]) == {"max_new_tokens"}
    assert "max_steps" not in gpt2["limits"] and "max_new_tokens" in gpt2["limits"]


def test_an_image_model_lists_only_image_parameters(models, model_dir):
    spec = load_registry(model_dir / "registry.yaml").get("tiny-sd")
    sd = models["tiny-sd"]
    assert set(sd["parameters"]) == {"prompts", "seed", "negative_prompt", "width", "height",
                                     "steps", "guidance_scale", "num_images_per_prompt"}
    p = sd["parameters"]
    assert (p["steps"]["default"], p["steps"]["maximum"]) == (spec.defaults.steps,
                                                             spec.limits.max_steps)
    assert (p["width"]["minimum"], p["width"]["maximum"], p["width"]["multipleOf"]) == (
        spec.limits.min_size, spec.limits.max_size, 8)
    assert p["guidance_scale"]["default"] == spec.defaults.guidance_scale
    assert p["prompts"]["maxItems"] == spec.limits.max_prompts
    assert "max_new_tokens" not in sd["defaults"] and "max_new_tokens" not in sd["limits"]
    assert all(p[name].get("description") for name in p), p


def test_a_class_model_says_which_words_its_prompts_take(models):
    words = models["digits"]["parameters"]["prompts"]["items"]["description"]
    assert "3/three" in words and "9/nine" in words


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-sd", "digits"])
def test_the_listed_bounds_are_the_ones_enforced(client, models, name):
    params = models[name]["parameters"]
    prompt = "3" if name == "digits" else "x"
    at_max = {k: p["maximum"] for k, p in params.items()
              if "maximum" in p and k not in ("seed", "guidance_scale", "temperature", "top_p")}
    body = {"model": name, "input": {"prompts": [prompt], **at_max}}
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 202, (body, resp.text)
    over = {k: v + (8 if "multipleOf" in params[k] else 1) for k, v in at_max.items()}
    resp = client.post("/v1/jobs", json={"model": name, "input": {"prompts": [prompt], **over}})
    assert resp.status_code == 422
    assert {d["loc"][-1] for d in resp.json()["detail"]} == set(over)


def test_the_list_is_also_openais(client):
    body = client.get("/v1/models").json()
    assert body["object"] == "list" and body["data"] == body["models"]
    for m in body["data"]:
        assert m["id"] == m["name"] and m["object"] == "model" and m["owned_by"] == "fibermill"
        assert isinstance(m["created"], int) and m["created"] > 0  # the files are here
    chat = {m["id"] for m in body["data"] if m["chat"]}
    assert chat == {"pydoc-gpt2"}  # the one model with a chat template


def test_one_model_by_name(client):
    one = client.get("/v1/models/tiny-gpt2")
    assert one.status_code == 200 and one.json()["id"] == "tiny-gpt2"
    missing = client.get("/v1/models/no-such-model")
    assert missing.status_code == 404 and "no-such-model" in missing.json()["detail"]
