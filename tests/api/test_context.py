"""A text job's prompts against its model's context, counted in the API with the model's own
tokenizer: refused with a 422 that names the prompt, the limit and the counts, never cut; a
budget left out is lowered to the room left. /v1/models says each model's context."""

import pytest
from fastapi.testclient import TestClient
from transformers import AutoTokenizer

from services.api.app import create_app
from shared.registry import load_registry

# pydoc-gpt2 has 128 positions (its config's n_positions); tiny-gpt2 1,024.
PYDOC = "pydoc-gpt2"


@pytest.fixture
def client(settings_env):
    with TestClient(create_app()) as c:
        yield c


@pytest.fixture(scope="module")
def count(model_dir):
    path = load_registry(model_dir / "registry.yaml").get(PYDOC).path
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return lambda text: len(tokenizer(text)["input_ids"])


def _job(client, prompts, **inp):
    return client.post("/v1/jobs", json={"model": PYDOC, "input": {"prompts": prompts, **inp}})


def test_models_say_their_context(client):
    models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert models[PYDOC]["context_length"] == 128
    assert models["tiny-gpt2"]["context_length"] == 1024
    assert models["tiny-sd"]["context_length"] is None  # not a text model
    assert client.get(f"/v1/models/{PYDOC}").json()["context_length"] == 128


def test_a_prompt_and_budget_past_the_context_name_the_prompt_limit_and_counts(client, count):
    short, long = "Return the number of items.", "Return the number of items. " * 20
    n = count(long)
    assert count(short) + 100 <= 128 < n + 100
    resp = _job(client, [short, long, long], max_new_tokens=100)
    assert resp.status_code == 422, resp.text
    detail = resp.json()["detail"]
    assert [d["loc"] for d in detail] == [["body", "input", "prompts", "1"],
                                          ["body", "input", "prompts", "2"]]
    assert {d["type"] for d in detail} == {"context_length_exceeded"}
    assert detail[0]["msg"] == (f"is {n} tokens long; with max_new_tokens 100 that is "
                                f"{n + 100} tokens, above model {PYDOC}'s context of 128 tokens")


def test_a_prompt_that_fits_exactly_is_taken_whole(client, count):
    prompt = "Return the number of items. " * 5
    resp = _job(client, [prompt], max_new_tokens=128 - count(prompt))
    assert resp.status_code == 202, resp.text
    assert resp.json()["input"]["prompts"] == [prompt]


def test_a_budget_left_out_is_the_default_or_the_room_left(client, count):
    short = "Open the file."
    taken = _job(client, [short]).json()
    assert taken["input"]["max_new_tokens"] is None  # the default (32) fits
    prompt = "Return the number of items. " * 17  # leaves less than 32
    room = 128 - count(prompt)
    assert 0 < room < 32
    taken = _job(client, [short, prompt]).json()
    assert taken["input"]["max_new_tokens"] == room  # what the longest prompt leaves


def test_a_prompt_that_leaves_no_room_is_refused_without_a_budget(client, count):
    prompt = "Return the number of items. " * 30
    resp = _job(client, [prompt])
    assert resp.status_code == 422
    (d,) = resp.json()["detail"]
    assert d["loc"] == ["body", "input", "prompts", "0"]
    assert d["msg"] == (f"is {count(prompt)} tokens long, which leaves no room for a new token "
                        f"in model {PYDOC}'s context of 128 tokens")


def test_other_problems_come_first(client):
    resp = _job(client, ["Return the number of items. " * 30], max_new_tokens=500)
    assert resp.status_code == 422
    assert [d["type"] for d in resp.json()["detail"]] == ["above_limit"]
