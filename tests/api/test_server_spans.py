"""The HTTP server spans (services/api/server_spans.py): one per request, named from the route
that matched, a child of the caller's traceparent, the current span inside the request, failed
on a 5xx, and none for the probes. Spans kept in memory (tests/span_capture.py)."""

from fastapi import FastAPI
from fastapi.testclient import TestClient
from opentelemetry.trace import SpanKind, StatusCode

from services.api import server_spans
from services.api.server_spans import ServerSpans, excluded_paths
from shared import tracing

CALLER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _client() -> TestClient:
    app = FastAPI()

    @app.get("/v1/jobs/{job_id}")
    async def get_job(job_id: str) -> dict:
        # What the request does is under its server span.
        return {"id": job_id, "traceparent": tracing.current_traceparent()}

    @app.get("/healthz")
    async def healthz() -> dict:
        return {}

    @app.get("/boom")
    async def boom() -> dict:
        raise RuntimeError("boom")

    app.add_middleware(ServerSpans, excluded=excluded_paths({}))
    return TestClient(app, raise_server_exceptions=False)


def test_a_request_is_a_server_span_named_by_its_route_and_current_inside(exported):
    exporter, _ = exported
    r = _client().get("/v1/jobs/abc", headers={"user-agent": "probe/1"})
    (span,) = exporter.get_finished_spans()
    assert span.name == "GET /v1/jobs/{job_id}" and span.kind == SpanKind.SERVER
    assert span.parent is None  # no caller's trace: the root of its own
    assert r.json()["traceparent"] == tracing.traceparent_of(span.context)
    assert span.attributes["http.route"] == "/v1/jobs/{job_id}"
    assert span.attributes["url.path"] == "/v1/jobs/abc"
    assert span.attributes["http.request.method"] == "GET"
    assert span.attributes["http.response.status_code"] == 200
    assert span.attributes["user_agent.original"] == "probe/1"
    assert span.status.status_code == StatusCode.UNSET


def test_each_request_has_its_own_path_and_its_clients_attributes(exported, monkeypatch):
    # What a client's requests share is built once and kept; two clients' kept in turn, with
    # room for one, each request still has its own.
    monkeypatch.setattr(server_spans, "_SHARED_MAX", 1)
    exporter, _ = exported
    client = _client()
    sent = [("a", "probe/1"), ("b", "probe/2"), ("c", "probe/1"), ("d", "probe/1")]
    for path, agent in sent:
        client.get(f"/v1/jobs/{path}", headers={"user-agent": agent})
    spans = exporter.get_finished_spans()
    assert [(s.attributes["url.path"], s.attributes["user_agent.original"]) for s in spans] == [
        (f"/v1/jobs/{path}", agent) for path, agent in sent]
    assert all(s.attributes["server.address"] == "testserver" for s in spans)
    assert all(s.attributes["client.address"] == "testclient" for s in spans)
    assert len(server_spans._shared) == 1


def test_a_callers_traceparent_is_its_parent(exported):
    exporter, _ = exported
    _client().get("/v1/jobs/abc", headers={"traceparent": CALLER})
    (span,) = exporter.get_finished_spans()
    assert f"{span.context.trace_id:032x}" == tracing.trace_id(CALLER)
    assert f"{span.parent.span_id:016x}" == "00f067aa0ba902b7"


def test_a_server_error_fails_its_span_and_an_unknown_path_keeps_the_method(exported):
    exporter, _ = exported
    client = _client()
    assert client.get("/boom").status_code == 500
    assert client.get("/nowhere").status_code == 404
    boom, nowhere = exporter.get_finished_spans()
    assert boom.name == "GET /boom" and boom.status.status_code == StatusCode.ERROR
    assert boom.attributes["http.response.status_code"] == 500
    assert boom.attributes["error.type"] == "RuntimeError"
    assert nowhere.name == "GET" and nowhere.status.status_code == StatusCode.UNSET
    assert nowhere.attributes["http.response.status_code"] == 404


def test_probes_make_no_span_and_the_standard_variable_replaces_the_list(exported):
    exporter, _ = exported
    assert _client().get("/healthz").status_code == 200
    assert exporter.get_finished_spans() == ()
    mine = excluded_paths({"OTEL_PYTHON_FASTAPI_EXCLUDED_URLS": "/v1/jobs/.*,/boom"})
    assert mine is not None and mine.search("/v1/jobs/abc") and mine.search("/boom")
    assert not mine.search("/healthz")
    assert excluded_paths({"OTEL_PYTHON_FASTAPI_EXCLUDED_URLS": " "}) is None
