"""Bad input gets a 422 naming the field, and nothing is stored or enqueued."""

import json

import pytest
from fastapi.testclient import TestClient

from services.api.app import create_app
from shared import names
from tests.conftest import queued


@pytest.fixture
def client(settings_env):
    with TestClient(create_app()) as c:
        yield c


def _fields(resp) -> list[str]:
    return [".".join(str(p) for p in d["loc"]) for d in resp.json()["detail"]]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            {"task": "text-generation", "model": "no-such-model", "input": {"prompts": ["x"]}},
            "body.model",
        ),
        ({"task": "text-generation", "model": "tiny-gpt2", "input": {"prompts": []}}, "prompts"),
        (
            {
                "task": "image-generation",
                "model": "digits",
                "input": {"prompts": ["7"], "seed": -1},
            },
            "seed",
        ),
        (
            {
                "task": "image-generation",
                "model": "tiny-sd",
                "input": {"prompts": ["x"], "width": 60, "height": 64},
            },
            "width",
        ),
        (
            {
                "task": "image-generation",
                "model": "tiny-sd",
                "input": {"prompts": ["x"], "width": 1024},
            },
            "body.input.width",
        ),
        (
            {
                "task": "image-generation",
                "model": "tiny-sd",
                "input": {"prompts": ["x"], "steps": 1000},
            },
            "body.input.steps",
        ),
        (
            {
                "task": "text-generation",
                "model": "tiny-gpt2",
                "input": {"prompts": ["x"], "max_new_tokens": 100000},
            },
            "body.input.max_new_tokens",
        ),
        (
            {"task": "image-generation", "model": "tiny-gpt2", "input": {"prompts": ["x"]}},
            "body.task",
        ),
        (
            {"task": "image-generation", "model": "digits", "input": {"prompts": ["a cat"]}},
            "body.input.prompts.0",
        ),
        (
            {"task": "text-generation", "model": "tiny-gpt2", "input": {"prompts": [""]}},
            "prompts.0",
        ),
        (
            {"task": "text-generation", "model": "tiny-gpt2",
             "input": {"prompts": ["x"], "response_format": {
                 "type": "json_schema", "json_schema": {"type": "strin"}}}},
            "body.input.response_format",
        ),
        (
            {"task": "text-generation", "model": "tiny-gpt2",
             "input": {"prompts": ["x"], "response_format": {"type": "json_schema"}}},
            "body.input.response_format",
        ),
        (
            {"task": "text-generation", "model": "tiny-gpt2",
             "input": {"prompts": ["x"], "logprobs": 21}},
            "body.input.logprobs",
        ),
    ],
)
def test_bad_input_is_a_422_naming_the_field(client, redis_url, sredis, body, field):
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 422, resp.text
    assert any(f.endswith(field) for f in _fields(resp)), (field, resp.json())
    for model in ("tiny-gpt2", "tiny-sd", "digits"):
        assert queued(redis_url, model) == 0
    assert not list(sredis.scan_iter(match=f"{names.PREFIX}:job:*"))


def test_digits_422_says_what_the_model_understands(client):
    resp = client.post(
        "/v1/jobs",
        json={"task": "image-generation", "model": "digits", "input": {"prompts": ["a cat"]}},
    )
    msg = resp.json()["detail"][0]["msg"]
    assert "7/seven" in msg


def test_accepted_job_is_split_and_enqueued(client, redis_url):
    resp = client.post(
        "/v1/jobs",
        json={
            "task": "image-generation",
            "model": "digits",
            "input": {"prompts": ["7", "three"], "num_images_per_prompt": 2, "seed": 1},
        },
    )
    assert resp.status_code == 202, resp.text
    job = resp.json()
    assert job["status"] == "queued" and job["progress"] == {"done": 0, "total": 4}
    assert job["urls"]["get"] == f"http://testserver/v1/jobs/{job['id']}"
    assert queued(redis_url, "digits") == 4
    assert client.get(f"/v1/jobs/{job['id']}").json()["id"] == job["id"]
    assert client.get("/v1/jobs/nope").status_code == 404
    assert client.get(f"/v1/jobs/{job['id']}/outputs/9").status_code == 404
    assert client.get(f"/v1/jobs/{job['id']}/outputs/0").status_code == 404  # not ready yet


def test_seed_is_chosen_and_stored_when_absent(client):
    job = client.post(
        "/v1/jobs",
        json={"task": "text-generation", "model": "tiny-gpt2", "input": {"prompts": ["x"]}},
    ).json()
    assert isinstance(job["input"]["seed"], int)


def test_readyz_without_workers_is_503(client):
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 503


TEXT = {"task": "text-generation", "model": "tiny-gpt2"}
IMAGE = {"task": "image-generation", "model": "tiny-sd"}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**TEXT, "input": {"prompts": ["x"], "temperature": "NaN"}}, "temperature"),
        ({**TEXT, "input": {"prompts": ["x"], "top_p": "NaN"}}, "top_p"),
        ({**TEXT, "input": {"prompts": ["x"]}, "deadline_seconds": "NaN"}, "deadline_seconds"),
        ({**TEXT, "input": {"prompts": ["x"]}, "deadline_seconds": "Infinity"},
         "deadline_seconds"),
        ({**IMAGE, "input": {"prompts": ["x"], "guidance_scale": "-Infinity"}},
         "guidance_scale"),
    ],
)
def test_non_finite_numbers_are_a_422_naming_the_field(client, body, field, redis_url):
    # Python's json writes NaN and Infinity as bare words, as a sloppy client would send them.
    raw = json.dumps(body).replace('"NaN"', "NaN").replace('"Infinity"', "Infinity") \
        .replace('"-Infinity"', "-Infinity")
    resp = client.post("/v1/jobs", content=raw, headers={"Content-Type": "application/json"})
    assert resp.status_code == 422, resp.text
    assert any(f.endswith(field) for f in _fields(resp))
    assert queued(redis_url, body["model"]) == 0


@pytest.mark.parametrize("top_k", [1001, 10**400])
def test_top_k_is_bounded(client, top_k):
    resp = client.post("/v1/jobs", json={**TEXT, "input": {"prompts": ["x"], "top_k": top_k,
                                                           "temperature": 1.0}})
    assert resp.status_code == 422
    assert any(f.endswith("top_k") for f in _fields(resp))
    assert "1000" in resp.text


def test_a_stop_string_is_bounded(client):
    resp = client.post("/v1/jobs", json={**TEXT, "input": {"prompts": ["x"],
                                                           "stop": ["y" * 257]}})
    assert resp.status_code == 422
    assert any("stop" in f for f in _fields(resp))


def _problems(resp) -> dict[str, str]:
    return {".".join(str(p) for p in d["loc"][1:]): d["msg"] for d in resp.json()["detail"]}


def test_every_problem_of_an_input_is_reported_at_once(client):
    resp = client.post("/v1/jobs", json={"model": "digits", "input": {
        "prompts": ["3", "a cat"], "steps": 5000, "width": 32, "num_images_per_prompt": 9}})
    assert resp.status_code == 422
    found = _problems(resp)
    assert set(found) == {"input.steps", "input.width", "input.num_images_per_prompt",
                          "input.prompts.1"}, found
    assert found["input.steps"].startswith("5000 is above model digits's limit of ")
    assert found["input.width"] == "must be 16 for model digits"
    assert found["input.num_images_per_prompt"] == "9 is above model digits's limit of 8"
    assert found["input.prompts.1"].startswith("'a cat' names no class this model knows")


def test_type_problems_and_limit_problems_come_together(client):
    resp = client.post("/v1/jobs", json={"model": "tiny-sd", "input": {
        "prompts": [""], "steps": "many", "width": 60, "height": 1024, "guidance_scale": 99}})
    assert resp.status_code == 422
    found = _problems(resp)
    assert found == {
        "input.prompts.0": "must not be empty",
        "input.steps": "must be a whole number",
        "input.width": "must be a multiple of 8, got 60",
        "input.height": "1024 is outside model tiny-sd's range 32..256",
        "input.guidance_scale": "must be at most 50",
    }


def test_problems_of_the_request_itself_are_in_the_projects_words(client):
    resp = client.post("/v1/jobs", json={"model": "tiny-gpt2", "input": {"prompts": ["x"]},
                                         "priority": 12, "colour": "red"})
    assert resp.status_code == 422
    assert _problems(resp) == {"priority": "must be at most 9",
                               "colour": "is not a field of this request"}
    resp = client.post("/v1/jobs", json={"model": "tiny-gpt2",
                                         "input": {"prompts": ["x"], "temprature": 1}})
    assert _problems(resp) == {"input.temprature": "is not a field of this request"}


def test_a_refused_envelope_does_not_hide_the_inputs_problems(client):
    # A form with a wrong priority and a wrong input shows both at once, not the priority's
    # problem first and the input's after it is fixed.
    resp = client.post("/v1/jobs", json={"model": "digits", "priority": 10, "input": {
        "prompts": ["dog"], "width": 24, "seed": -1}})
    assert resp.status_code == 422
    found = _problems(resp)
    assert set(found) == {"priority", "input.prompts.0", "input.width", "input.seed"}, found
    assert found["priority"] == "must be at most 9"
    assert found["input.width"] == "must be 16 for model digits"
    # Nothing is added where the model is not known, or the input is fine.
    for model in ("no-such-model", ["digits"]):
        resp = client.post("/v1/jobs", json={"model": model, "priority": 10,
                                             "input": {"prompts": ["dog"]}})
        assert set(_problems(resp)) <= {"priority", "model"}, resp.text
    resp = client.post("/v1/jobs", json={"model": "digits", "priority": 10,
                                         "input": {"prompts": ["3"]}})
    assert _problems(resp) == {"priority": "must be at most 9"}


def test_task_is_inferred_from_the_model_when_absent(client):
    resp = client.post("/v1/jobs", json={"model": "tiny-gpt2", "input": {"prompts": ["x"]}})
    assert resp.status_code == 202, resp.text
    assert resp.json()["task"] == "text-generation"
    resp = client.post("/v1/jobs", json={"model": "digits", "input": {"prompts": ["3"]}})
    assert resp.status_code == 202, resp.text
    assert resp.json()["task"] == "image-generation"


def test_a_task_that_is_given_is_still_checked(client):
    resp = client.post("/v1/jobs", json={"task": "image-generation", "model": "tiny-gpt2",
                                         "input": {"prompts": ["x"], "steps": 5}})
    assert resp.status_code == 422
    found = _problems(resp)
    # The input is read as the model's own task's, so its problems are found too.
    assert set(found) == {"task", "input.steps"}, found
    assert "serves text-generation, not image-generation" in found["task"]
