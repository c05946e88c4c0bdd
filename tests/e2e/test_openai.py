"""The OpenAI-compatible endpoints through the official `openai` client, against a running stack:
each call is a Fibermill job, and its answer (or stream) is OpenAI's."""

import base64
import json
import struct

import httpx
import jsonschema
import openai
import pytest
from transformers import AutoTokenizer

from services.api.openai.chat_template import render_chat
from shared.registry import load_registry
from tests.e2e.conftest import FINAL

pytestmark = pytest.mark.e2e

CHAT = [{"role": "system", "content": "You document Python."},
        {"role": "user", "content": "Return the number of items"}]


@pytest.fixture(scope="module")
def client(stack):
    with openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0,
                       timeout=120) as c:
        yield c


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_chat_is_a_job_on_the_rendered_conversation(client, stack, model_dir):
    answer = client.chat.completions.create(model="pydoc-gpt2", messages=CHAT, temperature=0,
                                            max_tokens=12)
    assert answer.object == "chat.completion" and answer.model == "pydoc-gpt2"
    (choice,) = answer.choices
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    # The same conversation as a plain job, its prompt rendered with the model's template,
    # gives the same text: no second execution path.
    job_id = answer.id.removeprefix("chatcmpl-")
    job = stack.http.get(f"/v1/jobs/{job_id}").json()
    spec = load_registry(model_dir / "registry.yaml").get("pydoc-gpt2")
    prompt = render_chat(spec.chat_template, CHAT)
    assert job["status"] == "succeeded" and job["input"]["prompts"] == [prompt]
    plain = stack.run({"model": "pydoc-gpt2", "input": {"prompts": [prompt],
                                                        "max_new_tokens": 12}})
    assert choice.message.content == plain["output"][0]["text"]
    prompt_tokens = len(AutoTokenizer.from_pretrained(spec.path)(prompt)["input_ids"])
    assert answer.usage.prompt_tokens == prompt_tokens
    assert answer.usage.completion_tokens == plain["output"][0]["tokens"]
    assert answer.usage.total_tokens == prompt_tokens + answer.usage.completion_tokens


def test_completions_of_several_prompts_come_prompt_by_prompt(client):
    answer = client.completions.create(model="tiny-gpt2", prompt=["Hello", "Goodbye"], n=2,
                                       max_tokens=5, seed=11, echo=True)
    assert answer.object == "text_completion"
    assert [c.index for c in answer.choices] == [0, 1, 2, 3]
    assert [c.text.split(" ")[0][:5] for c in answer.choices][::2] == ["Hello", "Goodb"]
    assert all(c.text.startswith(("Hello", "Goodbye")) for c in answer.choices)
    assert 0 < answer.usage.completion_tokens <= 4 * 5
    # Sampled (OpenAI's default temperature is 1), with the seed: the same call, the same text.
    again = client.completions.create(model="tiny-gpt2", prompt=["Hello", "Goodbye"], n=2,
                                      max_tokens=5, seed=11, echo=True)
    assert [c.text for c in again.choices] == [c.text for c in answer.choices]


def test_images_inline_and_by_url(client, stack):
    inline = client.images.generate(model="digits", prompt="7", n=2, size="16x16",
                                    response_format="b64_json")
    assert len(inline.data) == 2
    assert all(_png_size(base64.b64decode(d.b64_json)) == (16, 16) for d in inline.data)
    linked = client.images.generate(model="digits", prompt="three")
    (image,) = linked.data
    assert image.url.startswith(stack.base_url) and "/outputs/0" in image.url
    assert _png_size(httpx.get(image.url).content) == (16, 16)


def test_a_streamed_chat_adds_up_to_the_answer(client):
    asked = {"model": "pydoc-gpt2", "messages": CHAT, "temperature": 0, "max_tokens": 24}
    whole = client.chat.completions.create(**asked)
    chunks = list(client.chat.completions.create(**asked, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(pieces) == whole.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == whole.choices[0].finish_reason and not any(finals[:-1])
    assert not chunks[-1].choices and chunks[-1].usage == whole.usage
    assert {c.id for c in chunks} == {chunks[0].id} and chunks[0].id != whole.id


def test_tokens_arrive_while_the_job_decodes(client, stack):
    stream = client.completions.create(model="tiny-gpt2", prompt="Once", max_tokens=200,
                                       temperature=0, stream=True)
    texts, seen_running = [], False
    for chunk in stream:
        texts.append(chunk.choices[0].text)
        if len(texts) == 1:
            job = stack.http.get(f"/v1/jobs/{chunk.id.removeprefix('cmpl-')}").json()
            seen_running = job["status"] in ("queued", "running")
    job = stack.wait(chunk.id.removeprefix("cmpl-"))  # its result is stored just after
    assert seen_running  # the first text came before the job ended
    assert len([t for t in texts if t]) > 5  # many pieces, not one at the end
    assert "".join(texts) == job["output"][0]["text"]


def test_the_job_event_stream_carries_the_same_text(stack):
    job = stack.submit({"model": "tiny-gpt2", "input": {"prompts": ["Once"],
                                                        "max_new_tokens": 60, "stream": True}})
    texts = []
    with stack.http.stream("GET", f"/v1/jobs/{job['id']}/events") as r:
        event = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: ") and event == "output":
                texts.append(json.loads(line.removeprefix("data: "))["text"])
            elif (line.startswith("data: ") and event == "status"
                  and json.loads(line.removeprefix("data: "))["status"] in FINAL):
                break
    final = stack.wait(job["id"])
    # Joined late, the stream may have missed the first pieces, never the end.
    assert texts and final["output"][0]["text"].endswith("".join(texts))


def test_a_client_that_goes_away_cancels_its_job(stack):
    # Long image jobs ahead on both workers keep the chat's job from starting, let alone
    # ending, before its client leaves; a chat stream opens with the role at once.
    blockers = [stack.submit({"model": "digits", "input": {"prompts": ["1"], "steps": 1000,
                                                           "num_images_per_prompt": 4}})
                for _ in range(2)]
    body = {"model": "pydoc-gpt2", "messages": CHAT, "stream": True}
    with stack.http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        line = next(line for line in r.iter_lines() if line.startswith("data: "))
    job_id = json.loads(line.removeprefix("data: "))["id"].removeprefix("chatcmpl-")
    assert stack.wait(job_id, timeout=60)["status"] == "canceled"
    for b in blockers:
        stack.http.post(f"/v1/jobs/{b['id']}/cancel")


PERSON = {"type": "object", "additionalProperties": False,
          "properties": {"name": {"type": "string"}, "year": {"type": "integer"},
                         "kind": {"enum": ["module", "class", "function"]}},
          "required": ["name", "year", "kind"]}


def test_a_json_schema_answer_parses_and_validates(client):
    # pydoc-gpt2 was never trained to write JSON: the grammar alone makes it valid.
    answer = client.chat.completions.create(
        model="pydoc-gpt2", messages=CHAT, max_tokens=40, n=2, temperature=1.0, seed=3,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    for choice in answer.choices:
        jsonschema.validate(json.loads(choice.message.content or ""), PERSON)


def test_a_streamed_json_mode_completion_adds_up_to_an_object(client):
    # OpenAI's legacy completions have no response_format; this server takes it there too.
    stream = client.completions.create(model="tiny-gpt2", prompt="Describe it:", max_tokens=24,
                                       stream=True,
                                       extra_body={"response_format": {"type": "json_object"}})
    text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    assert isinstance(json.loads(text), dict)


def test_errors_are_openais(client):
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="no-such-model", prompt="x")
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as limit:
        client.chat.completions.create(model="pydoc-gpt2", messages=CHAT, max_tokens=10_000)
    assert limit.value.param == "max_tokens" and "127" in limit.value.message
    with pytest.raises(openai.BadRequestError) as unsupported:
        client.chat.completions.create(model="pydoc-gpt2", messages=CHAT, presence_penalty=0.5)
    assert unsupported.value.param == "presence_penalty"
    assert "not supported" in unsupported.value.message
    with pytest.raises(openai.BadRequestError) as no_template:
        client.chat.completions.create(model="tiny-gpt2", messages=CHAT)
    assert no_template.value.param == "model" and "chat template" in no_template.value.message


def test_models_lists_them_for_the_client(client):
    ids = {m.id for m in client.models.list()}
    assert {"pydoc-gpt2", "tiny-gpt2", "digits"} <= ids
    assert client.models.retrieve("digits").owned_by == "fibermill"
