"""Tracing's switch and its trace context as text. The SDK itself is set up only in the
services' own processes (tests/e2e/test_tracing.py): once on in a process it stays on, so this
process keeps it off and checks that off costs nothing but a flag."""

import pytest

from shared import tracing


@pytest.mark.parametrize(("env", "on"), [
    ({}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
    ({"OTEL_SERVICE_NAME": "api"}, False),  # a name alone exports nothing
])
def test_on_only_when_an_exporter_is_named(env, on):
    assert tracing.wanted(env) is on


def test_an_unknown_exporter_or_protocol_is_refused_by_name():
    with pytest.raises(ValueError, match="'zipkin'"):
        tracing._exporters({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(ValueError, match="http/json"):
        tracing._exporters({"OTEL_TRACES_EXPORTER": "otlp",
                            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


def test_both_otlp_protocols_make_an_exporter():
    for protocol in ("grpc", "http/protobuf"):
        (exporter,) = tracing._exporters({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": protocol})
        assert "OTLPSpanExporter" in type(exporter).__name__
        assert protocol.split("/")[0] in type(exporter).__module__
        exporter.shutdown()


def test_trace_ids_are_read_from_a_traceparent():
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert tracing.trace_id(tp) == "4bf92f3577b34da6a3ce929d0e0e4736"
    ctx = tracing.span_context_of(tp)
    assert ctx is not None and f"{ctx.span_id:016x}" == "00f067aa0ba902b7"
    assert tracing.trace_id(None) is None and tracing.trace_id("garbage") is None
    assert tracing.span_context_of(None) is None


def test_off_makes_no_spans():
    assert not tracing.enabled()
    with tracing.span("fibermill.submit") as s:
        assert s is None
        assert tracing.current_traceparent() is None
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert tracing.start("fibermill.lease", tp) is None


def test_a_traceparent_is_read_as_its_remote_span_or_refused():
    ctx = tracing.span_context_of("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
    assert ctx is not None and ctx.is_remote and not ctx.trace_flags.sampled
    for bad in ("00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # invalid ids
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bx-01",
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", ""):
        assert tracing.span_context_of(bad) is None, bad
    assert tracing.parent_of(None) is None and tracing.parent_of("") is None


def test_instrumentations_follow_the_standard_disabling_variable(monkeypatch):
    assert not tracing.instrumenting("celery", {})  # off: none
    monkeypatch.setattr(tracing, "_on", True)  # the flag alone: no SDK is set up here
    var = "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"
    assert tracing.instrumenting("celery", {}) and tracing.instrumenting("fastapi", {var: ""})
    assert not tracing.instrumenting("celery", {var: "fastapi, celery"})
    assert tracing.instrumenting("fastapi", {var: "celery"})
    assert not tracing.instrumenting("fastapi", {var: "*"})


def test_a_callers_traceparent_is_continued_where_no_span_is_current(monkeypatch):
    from opentelemetry import trace

    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with tracing.continued(tp):  # off: nothing attached
        assert not trace.get_current_span().get_span_context().is_valid
    monkeypatch.setattr(tracing, "_on", True)  # the flag alone: no SDK is set up here
    with tracing.continued(tp):
        inside = trace.get_current_span().get_span_context()
        assert f"{inside.trace_id:032x}" == tracing.trace_id(tp) and inside.is_remote
        other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        with tracing.continued(other):  # a span is current already: it stays the parent
            assert trace.get_current_span().get_span_context() == inside
    assert not trace.get_current_span().get_span_context().is_valid
