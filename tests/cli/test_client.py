"""The client and the event parser, without a server."""

import httpx
import pytest

from services.cli.args import build_parser
from services.cli.client import ApiError, Client, field_name
from services.cli.sse import parse_events


def test_events_are_parsed_across_comments_and_multiline_data():
    lines = [": ping", "event: status", 'data: {"id":', 'data: "x"}', "", "event: step",
             'data:{"step":1}', "", "data: {}", ""]
    assert list(parse_events(lines)) == [("status", {"id": "x"}), ("step", {"step": 1}),
                                         ("message", {})]


def test_an_unfinished_event_is_not_yielded():
    assert list(parse_events(["event: status", 'data: {"a": 1}'])) == []


def test_key_and_url_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("FIBERMILL_URL", "http://api.example:9000")
    monkeypatch.setenv("FIBERMILL_API_KEY", "k-123")
    args = build_parser().parse_args(["models"])
    assert (args.url, args.api_key) == ("http://api.example:9000", "k-123")


def test_the_key_is_sent_as_a_bearer_token():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("Authorization"))
        return httpx.Response(200, json={"models": []})

    with Client("http://api", "k-123", transport=httpx.MockTransport(handler)) as client:
        assert client.models() == []
    assert seen == ["Bearer k-123"]


@pytest.mark.parametrize(
    ("loc", "name"),
    [(["body", "image-generation", "input", "width"], "input.width"),
     (["body", "input", "prompts", 0], "input.prompts.0"),
     (["body", "model"], "model"),
     (["body"], "request")],
)
def test_field_names(loc, name):
    assert field_name(loc) == name


def test_errors_carry_fields_and_retry_after():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(422, json={"detail": [
                {"loc": ["body", "input", "width"], "msg": "too wide", "type": "x"}]})
        return httpx.Response(429, headers={"Retry-After": "7"},
                              json={"detail": "slow down", "code": "rate_limited"})

    with Client("http://api", transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(ApiError) as invalid:
            client.submit({})
        with pytest.raises(ApiError) as limited:
            client.job("x")
    assert invalid.value.fields == {"input.width": "too wide"}
    assert limited.value.retry_after == 7 and str(limited.value) == "slow down (retry after 7s)"
