"""Log-probabilities on the OpenAI text routes: asked in OpenAI's words (and refused as OpenAI
refuses them), passed to the job, and answered in OpenAI's chat and legacy completion shapes."""

import pytest
from fastapi.testclient import TestClient

from services.api.app import create_app
from services.api.openai.schemas import ChatCompletionRequest, CompletionRequest
from services.api.openai.translate import CHAT, COMPLETIONS, job_request, parse, text_response
from shared.job import JobStatus
from shared.jobstore import JobRecord
from shared.registry import load_registry
from shared.settings import get_settings

KEY = "fm-test-logprobs-key"
MESSAGES = [{"role": "user", "content": "hi"}]


def tok(token: str, raw: list[int], lp: float, top: list[tuple[str, list[int], float]]
        ) -> dict:
    """A stored output's token entry (GeneratedText.logprobs' shape)."""
    return {"token": token, "bytes": raw, "logprob": lp,
            "top_logprobs": [{"token": t, "bytes": b, "logprob": p} for t, b, p in top]}


# "Hé!" in four tokens: "é" is two bytes, each its own token (neither a character alone).
TEXT = "Hé!"
TOKENS = [
    tok("H", [72], -0.5, [("H", [72], -0.5), ("A", [65], -1.5)]),
    tok("\ufffd", [195], -0.25, [("\ufffd", [195], -0.25), ("\ufffd", [196], -2.0)]),
    tok("\ufffd", [169], -0.125, [("\ufffd", [169], -0.125), ("x", [120], float("-inf"))]),
    tok("!", [33], -3.0, [("?", [63], -1.0), (".", [46], -2.0)]),  # chosen: not among them
]


@pytest.fixture
def client(settings_env, monkeypatch):
    monkeypatch.setenv("FIBERMILL_API_KEYS", KEY)
    get_settings.cache_clear()
    with TestClient(create_app(), headers={"Authorization": f"Bearer {KEY}"}) as c:
        yield c


@pytest.fixture
def registry(model_dir):
    return load_registry(model_dir / "registry.yaml")


def _refused(client, path: str, body: dict) -> dict:
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    return r.json()["error"]


def test_top_logprobs_needs_logprobs_and_both_are_bounded(client):
    chat = {"model": "pydoc-gpt2", "messages": MESSAGES}
    e = _refused(client, "/v1/chat/completions", {**chat, "top_logprobs": 2})
    assert e["param"] == "top_logprobs" and "logprobs" in e["message"]
    e = _refused(client, "/v1/chat/completions", {**chat, "logprobs": False, "top_logprobs": 0})
    assert e["param"] == "top_logprobs"
    e = _refused(client, "/v1/chat/completions", {**chat, "logprobs": True, "top_logprobs": 21})
    assert e["param"] == "top_logprobs" and "at most 20" in e["message"]
    e = _refused(client, "/v1/chat/completions", {**chat, "logprobs": True, "top_logprobs": -1})
    assert e["param"] == "top_logprobs" and "at least 0" in e["message"]
    e = _refused(client, "/v1/chat/completions", {**chat, "logprobs": "many"})
    assert e["param"] == "logprobs"
    completion = {"model": "tiny-gpt2", "prompt": "x"}
    e = _refused(client, "/v1/completions", {**completion, "logprobs": 6})
    assert e["param"] == "logprobs" and "at most 5" in e["message"]
    e = _refused(client, "/v1/completions", {**completion, "logprobs": -1})
    assert e["param"] == "logprobs"


def test_asked_logprobs_become_the_jobs_input(registry):
    def chat(**fields):
        return job_request(parse(CHAT, {"model": "pydoc-gpt2", "messages": MESSAGES,
                                        **fields}), registry).input

    assert "logprobs" not in chat() and "logprobs" not in chat(logprobs=False)
    assert chat(logprobs=True)["logprobs"] == 0  # the chosen tokens' only
    assert chat(logprobs=True, top_logprobs=20)["logprobs"] == 20
    assert chat(logprobs=True, top_logprobs=None)["logprobs"] == 0

    def completion(**fields):
        return job_request(parse(COMPLETIONS, {"model": "tiny-gpt2", "prompt": "x",
                                               **fields}), registry).input

    assert "logprobs" not in completion() and "logprobs" not in completion(logprobs=None)
    assert completion(logprobs=0)["logprobs"] == 0
    assert completion(logprobs=5, n=2)["logprobs"] == 5


def _answer(endpoint: str, body: dict, outputs: list[dict | None]) -> dict:
    req = parse(endpoint, body)
    assert isinstance(req, ChatCompletionRequest | CompletionRequest)
    rec = JobRecord("01" * 16, "text-generation", body["model"], JobStatus.SUCCEEDED, {},
                    len(outputs), 1.0, output=outputs)
    return text_response(req, rec)


def _output(text: str = TEXT, tokens: list[dict] | None = TOKENS) -> dict:
    return {"text": text, "finish_reason": "length", "tokens": len(TOKENS), "prompt_tokens": 3,
            "logprobs": tokens}


def test_a_chat_answer_has_each_tokens_logprob_and_its_alternatives():
    body = {"model": "pydoc-gpt2", "messages": MESSAGES, "logprobs": True, "top_logprobs": 2}
    choice = _answer(CHAT, body, [_output()])["choices"][0]
    assert choice["message"]["content"] == TEXT
    assert choice["logprobs"]["refusal"] is None and set(choice["logprobs"]) == {
        "content", "refusal"}
    content = choice["logprobs"]["content"]
    assert [list(c) for c in content] == [["token", "logprob", "bytes", "top_logprobs"]] * 4
    assert content[0] == {"token": "H", "logprob": -0.5, "bytes": [72], "top_logprobs": [
        {"token": "H", "logprob": -0.5, "bytes": [72]},
        {"token": "A", "logprob": -1.5, "bytes": [65]}]}
    assert [c["bytes"] for c in content] == [[72], [195], [169], [33]]
    # JSON has no -Infinity: OpenAI's -9999.0 stands for "very unlikely".
    assert content[2]["top_logprobs"][1]["logprob"] == -9999.0
    assert _answer(CHAT, {**body, "logprobs": False, "top_logprobs": None},
                   [_output()])["choices"][0]["logprobs"] is None  # not asked
    # Asked, but the output has none (a worker that does not score): null, not made up.
    assert _answer(CHAT, body, [_output(tokens=None)])["choices"][0]["logprobs"] is None


def test_a_completion_answer_has_openais_legacy_shape_with_text_offsets():
    body = {"model": "tiny-gpt2", "prompt": "Say", "logprobs": 2}
    lp = _answer(COMPLETIONS, body, [_output()])["choices"][0]["logprobs"]
    assert lp == {
        "tokens": ["H", "\ufffd", "\ufffd", "!"],
        "token_logprobs": [-0.5, -0.25, -0.125, -3.0],
        "top_logprobs": [{"H": -0.5, "A": -1.5}, {"\ufffd": -0.25},
                         {"\ufffd": -0.125, "x": -9999.0}, {"?": -1.0, ".": -2.0, "!": -3.0}],
        # "é" is one character, begun by the second token: the third starts where it does.
        "text_offset": [0, 1, 1, 2],
    }
    echoed = _answer(COMPLETIONS, {**body, "echo": True, "n": 2}, [_output(), _output()])
    for choice in echoed["choices"]:
        assert choice["text"] == "Say" + TEXT
        assert choice["logprobs"]["text_offset"] == [3, 4, 4, 5]  # past the echoed prompt
        assert choice["text"][choice["logprobs"]["text_offset"][3]] == "!"
    # logprobs 0: each place names the chosen token alone.
    zero = _answer(COMPLETIONS, {**body, "logprobs": 0},
                   [_output(tokens=[{**t, "top_logprobs": []} for t in TOKENS])])
    assert zero["choices"][0]["logprobs"]["top_logprobs"] == [
        {"H": -0.5}, {"\ufffd": -0.25}, {"\ufffd": -0.125}, {"!": -3.0}]
    assert _answer(COMPLETIONS, {**body, "logprobs": None},
                   [_output()])["choices"][0]["logprobs"] is None
