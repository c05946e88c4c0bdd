"""OpenAI requests onto jobs: the job's input, and problems named by OpenAI's fields."""

import pytest

from services.api.openai.translate import CHAT, COMPLETIONS, IMAGES, job_request, parse
from shared.errors import InvalidInput
from shared.registry import load_registry

MESSAGES = [{"role": "user", "content": [{"type": "text", "text": "Open "},
                                         {"type": "text", "text": "the file"}]}]


@pytest.fixture
def registry(model_dir):
    return load_registry(model_dir / "registry.yaml")


def _problems(endpoint, body, registry) -> dict[str, str]:
    with pytest.raises(InvalidInput) as exc:
        job_request(parse(endpoint, body), registry)
    return {p.field: p.message for p in exc.value.problems}


def test_a_chat_is_one_prompt_per_choice_with_openais_defaults(registry):
    job = job_request(parse(CHAT, {"model": "pydoc-gpt2", "messages": MESSAGES, "n": 3,
                                   "stop": "\n", "max_completion_tokens": 9}), registry)
    assert job.model == "pydoc-gpt2"
    assert job.input["prompts"] == ["User: Open the file\nAssistant:"] * 3
    assert job.input["max_new_tokens"] == 9 and job.input["stop"] == ["\n"]
    assert job.input["temperature"] == 1.0  # OpenAI samples by default; Fibermill's is greedy


def test_completions_go_prompt_by_prompt(registry):
    job = job_request(parse(COMPLETIONS, {"model": "tiny-gpt2", "prompt": ["a", "b"], "n": 2}),
                      registry, priority=9)
    assert job.input["prompts"] == ["a", "a", "b", "b"]
    assert job.input["max_new_tokens"] == 16 and job.priority == 9


def test_images_take_size_and_n(registry):
    job = job_request(parse(IMAGES, {"model": "tiny-sd", "prompt": "a cat", "n": 2,
                                     "size": "64x64"}), registry)
    assert job.input == {"prompts": ["a cat"], "num_images_per_prompt": 2, "seed": None,
                         "width": 64, "height": 64}


def test_problems_name_the_openai_fields(registry):
    assert set(_problems(CHAT, {"model": "pydoc-gpt2", "messages": MESSAGES,
                                "max_tokens": 10_000, "stop": ["a"] * 9}, registry)) == {
        "max_tokens", "stop"}
    assert set(_problems(COMPLETIONS, {"model": "tiny-gpt2", "prompt": ["ok", "x" * 5000],
                                       "n": 2}, registry)) == {"prompt.1"}
    assert set(_problems(IMAGES, {"model": "digits", "prompt": "7", "size": "64x64"},
                         registry)) == {"size"}
    assert set(_problems(COMPLETIONS, {"model": "tiny-gpt2", "prompt": ["x"] * 9, "n": 2},
                         registry)) == {"n"}


def test_what_cannot_be_honoured_is_refused_by_name(registry):
    for field, value in [("presence_penalty", 0.5), ("tools", [{}]), ("store", True)]:
        problems = _problems(CHAT, {"model": "pydoc-gpt2", "messages": MESSAGES,
                                    field: value}, registry)
        assert list(problems) == [field] and "not supported" in problems[field]
    assert "is not a field" in _problems(COMPLETIONS, {"model": "tiny-gpt2", "prompt": "x",
                                                       "frobnicate": 1}, registry)["frobnicate"]


def test_a_response_format_reaches_the_job_as_its_schema(registry):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    for path, body in ((CHAT, {"model": "pydoc-gpt2", "messages": MESSAGES}),
                       (COMPLETIONS, {"model": "tiny-gpt2", "prompt": "x"})):
        asked = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema,
                                                         "strict": True}}
        job = job_request(parse(path, {**body, "response_format": asked}), registry)
        assert job.input["response_format"] == {"type": "json_schema", "json_schema": schema}
        job = job_request(parse(path, {**body, "response_format": {"type": "json_object"}}),
                          registry)
        assert job.input["response_format"] == {"type": "json_object"}
        job = job_request(parse(path, {**body, "response_format": {"type": "text"}}),
                          registry)
        assert "response_format" not in job.input


def test_a_response_format_the_decoder_cannot_write_is_refused_by_name(registry):
    body = {"model": "pydoc-gpt2", "messages": MESSAGES}
    for fmt, reason in [({"type": "xml"}, "type must be"),
                        ({"type": "json_schema", "json_schema": {"name": "a"}}, "schema"),
                        ({"type": "json_schema", "json_schema": {
                            "name": "a", "schema": {"type": "strin"}}}, "strin")]:
        problems = _problems(CHAT, {**body, "response_format": fmt}, registry)
        assert list(problems) == ["response_format"] and reason in problems["response_format"]


def test_a_model_must_fit_the_endpoint(registry):
    assert "chat template" in _problems(CHAT, {"model": "tiny-gpt2", "messages": MESSAGES},
                                        registry)["model"]
    assert "images" in _problems(COMPLETIONS, {"model": "digits", "prompt": "7"},
                                 registry)["model"]
    assert "text" in _problems(IMAGES, {"model": "tiny-gpt2", "prompt": "7"}, registry)["model"]
    with pytest.raises(InvalidInput) as unknown:
        parse("/v1/embeddings", {})
    assert unknown.value.field == "url"
