"""On the OpenAI paths a prompt past the model's context is OpenAI's context_length_exceeded,
in OpenAI's words, also as a batch line's error; a model from a Hugging Face cache chats with
its tokenizer's own template and says its context."""

import pytest
import yaml
from fastapi.testclient import TestClient
from transformers import AutoTokenizer

from services.api.app import create_app
from services.api.openai.translate import CHAT, job_request, parse
from shared.registry import load_registry
from shared.settings import get_settings
from tests.api.test_batches import _batch, _get, _read, _wait
from tests.api.test_files import KEY_A, A, jsonl, line

LONG = "Return the number of items. " * 20  # about 120 of pydoc-gpt2's 128 positions


@pytest.fixture
def registry_path(model_dir, hub_cache, tmp_path):
    """The test models and tiny-chat, from the Hugging Face cache, with no template of its
    own in the registry."""
    raw = yaml.safe_load((model_dir / "registry.yaml").read_text())
    for spec in raw["models"].values():
        if not str(spec.get("path", "/")).startswith("/"):
            spec["path"] = str(model_dir / spec["path"])
    raw["models"]["tiny-chat"] = {"kind": "causal-lm", "path": "fibermill/tiny-chat",
                                  "hf_cache": str(hub_cache), "limits": {"max_new_tokens": 60}}
    path = tmp_path / "registry.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture
def client(settings_env, registry_path, monkeypatch):
    monkeypatch.setenv("FIBERMILL_MODEL_REGISTRY", str(registry_path))
    monkeypatch.setenv("FIBERMILL_API_KEYS", KEY_A)
    monkeypatch.setenv("FIBERMILL_BATCH_MAX_IN_FLIGHT", "2")
    get_settings.cache_clear()
    with TestClient(create_app(), headers=A) as c:
        yield c


@pytest.fixture(scope="module")
def count(model_dir):
    path = load_registry(model_dir / "registry.yaml").get("pydoc-gpt2").path
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return lambda text: len(tokenizer(text)["input_ids"])


def _error(r) -> dict:
    assert r.status_code == 400, r.text
    return r.json()["error"]


def test_a_chat_past_the_context_is_openais_context_length_exceeded(client, count):
    messages = [{"role": "user", "content": LONG}]
    e = _error(client.post("/v1/chat/completions", json={
        "model": "pydoc-gpt2", "messages": messages, "max_tokens": 50}))
    p = count(f"User: {LONG.strip()}\nAssistant:")  # the demo model's template
    assert e == {"message": f"This model's maximum context length is 128 tokens. However, you "
                            f"requested {p + 50} tokens ({p} in the messages, 50 in the "
                            f"completion). Please reduce the length of the messages or "
                            f"completion.",
                 "type": "invalid_request_error", "param": "messages",
                 "code": "context_length_exceeded"}


def test_without_max_tokens_only_a_prompt_with_no_room_left_is_refused(client, count):
    messages = [{"role": "user", "content": LONG * 2}]
    e = _error(client.post("/v1/chat/completions", json={"model": "pydoc-gpt2",
                                                          "messages": messages}))
    p = count(f"User: {(LONG * 2).strip()}\nAssistant:")
    assert e["message"] == (f"This model's maximum context length is 128 tokens. However, "
                            f"your messages resulted in {p} tokens. Please reduce the length "
                            f"of the messages.")
    assert (e["param"], e["code"]) == ("messages", "context_length_exceeded")


def test_a_completion_past_the_context_names_the_prompt(client, count):
    # max_tokens is 16 when left out, as OpenAI's: still past the context.
    e = _error(client.post("/v1/completions", json={"model": "pydoc-gpt2", "prompt": LONG}))
    p = count(LONG)
    assert f"you requested {p + 16} tokens ({p} in the prompt, 16 in the completion)" \
        in e["message"]
    assert (e["param"], e["code"]) == ("prompt", "context_length_exceeded")


def test_a_batch_line_past_the_context_fails_with_that_error(client):
    content = jsonl(line("long", "/v1/completions", model="pydoc-gpt2", prompt=LONG,
                         max_tokens=50))
    batch = _batch(client, content)
    done = _wait(lambda: (b := _get(client, batch["id"]))["status"] == "completed" and b,
                 what="the batch to complete")
    assert done["request_counts"] == {"total": 1, "completed": 0, "failed": 1}
    (failed,) = _read(client, done["error_file_id"], A)
    assert failed["custom_id"] == "long" and failed["response"]["status_code"] == 400
    error = failed["response"]["body"]["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "prompt")
    assert error["message"].startswith("This model's maximum context length is 128 tokens.")


def test_a_cached_model_chats_with_its_tokenizers_template_and_says_its_context(
        client, registry_path):
    model = client.get("/v1/models/tiny-chat").json()
    assert model["chat"] is True and model["context_length"] == 64
    job = job_request(parse(CHAT, {"model": "tiny-chat", "messages": [
        {"role": "user", "content": "hi"}], "max_tokens": 4}), load_registry(registry_path))
    assert job.input["prompts"] == ["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"]
    e = _error(client.post("/v1/chat/completions", json={
        "model": "tiny-chat", "messages": [{"role": "user", "content": LONG}],
        "max_tokens": 4}))
    assert e["code"] == "context_length_exceeded" and "is 64 tokens" in e["message"]
