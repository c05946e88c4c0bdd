"""The client and the event parser, without a server."""

import httpx
import pytest

from services.cli.args import build_parser
from services.cli.client import ApiError, Client, NotTheApi, Unreachable, field_name
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
    assert invalid.value.fields == [("input.width", "too wide")]
    assert limited.value.retry_after == 7 and str(limited.value) == "slow down (retry after 7s)"


def test_every_entry_of_a_422_is_kept_in_order_even_for_the_same_field():
    detail = [{"loc": ["body", "input", "steps"], "msg": "too many", "type": "x"},
              {"loc": ["body", "text-generation", "input", "top_p"], "msg": "above 1", "type": "x"},
              {"loc": ["body", "input", "steps"], "msg": "not even", "type": "x"}]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(422, json={"detail": detail})

    with (Client("http://api", transport=httpx.MockTransport(handler)) as client,
          pytest.raises(ApiError) as invalid):
        client.submit({})
    assert invalid.value.fields == [("input.steps", "too many"), ("input.top_p", "above 1"),
                                    ("input.steps", "not even")]


def _answering(*response_args, **response_kwargs) -> httpx.MockTransport:
    return httpx.MockTransport(lambda request: httpx.Response(*response_args, **response_kwargs))


def test_a_404_without_the_apis_code_names_the_url_tried_and_the_base_url_form():
    transport = _answering(404, json={"detail": "Not Found"})
    with (Client("http://api:8000/wrong/", transport=transport) as client,
          pytest.raises(NotTheApi) as wrong):
        client.models()
    assert str(wrong.value) == ("GET http://api:8000/wrong/v1/models answered 404 Not Found: "
                                "is --url the API's base URL (like http://api:8000)?")


def test_the_apis_own_404_stays_an_api_error():
    transport = _answering(404, json={"detail": "job x not found", "code": "not_found"})
    with (Client("http://api", transport=transport) as client,
          pytest.raises(ApiError) as unknown):
        client.job("x")
    assert (unknown.value.status, str(unknown.value)) == (404, "job x not found")


def test_an_answer_that_is_not_json_is_not_the_api():
    transport = _answering(200, text="<html>a web page</html>")
    with (Client("http://api/app", transport=transport) as client,
          pytest.raises(NotTheApi) as wrong):
        client.jobs(5)
    assert str(wrong.value).startswith("GET http://api/app/v1/jobs?limit=5 answered 200 OK, "
                                       "not JSON: is --url the API's base URL")


def test_no_answer_names_the_url_tried():
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused")

    with (Client("http://api:8000", transport=httpx.MockTransport(handler)) as client,
          pytest.raises(Unreachable) as refused):
        client.cancel("j1")
    assert str(refused.value) == (
        "cannot reach the API: POST http://api:8000/v1/jobs/j1/cancel failed "
        "([Errno 111] Connection refused); is it running at http://api:8000?")
