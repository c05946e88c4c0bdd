"""Fibermill's spans written as OTLP wire bytes (shared/otlp_wire.py) are what the OTLP
exporter's own encoder makes of the same spans as the SDK's ReadableSpan: parsed by
opentelemetry-proto's classes, the two requests are equal."""

import enum

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from shared import otlp_wire
from shared.messages import Outcome
from shared.open_span import Open


class _Level(enum.IntEnum):
    HIGH = 3


SAMPLED = TraceFlags(TraceFlags.SAMPLED)
TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
RESOURCE = Resource.create({"service.name": "fibermill-worker", "host.cores": 2})
SCOPE = InstrumentationScope("fibermill")


def _ctx(span_id: int, remote: bool = False, state: TraceState | None = None) -> SpanContext:
    return SpanContext(TRACE, span_id, is_remote=remote, trace_flags=SAMPLED, trace_state=state)


def _both(spans: list[tuple[Open, int]], resource: Resource = RESOURCE,
          scope: InstrumentationScope = SCOPE
          ) -> tuple[ExportTraceServiceRequest, ExportTraceServiceRequest]:
    wire = otlp_wire.request(resource, scope, [otlp_wire.span(s, end) for s, end in spans])
    sdk = [ReadableSpan(name=s.name, context=s.context, parent=s.parent, resource=resource,
                        attributes=s.all_attributes(), links=s.links, kind=s.kind,
                        status=s.status,
                        start_time=s.start_ns, end_time=end, instrumentation_scope=scope)
           for s, end in spans]
    return ExportTraceServiceRequest.FromString(wire), encode_spans(sdk)


ATTRIBUTES = [
    {},
    {"fibermill.job_id": "f" * 32, "fibermill.index": 0, "fibermill.worker": "worker-1"},
    {"empty": "", "zero": 0, "no": False, "yes": True, "half": 0.5, "negative": -7,
     "big": 2**62, "unicode": "caf\u00e9 \u2603", "long": "x" * 300},
    {"names": ("a", "b"), "counts": [1, -2, 3], "flags": [True, False], "ratios": [0.25]},
    # what the API's types allow less often: enums, bytes, a mapping, None
    {"outcome": Outcome.SUCCEEDED, "level": _Level.HIGH, "raw": b"\x00\xff",
     "nested": {"a": 1, "b": ["x"]}, "none": None},
]


@pytest.mark.parametrize("attributes", ATTRIBUTES)
def test_attributes_of_each_kind_encode_as_the_sdk_does(attributes):
    wire, sdk = _both([(Open("fibermill.lease", _ctx(2), _ctx(1, remote=True), 10**18,
                             dict(attributes)), 10**18 + 5)])
    assert wire == sdk


def test_a_batch_of_spans_as_a_worker_makes_them_encodes_as_the_sdk_does():
    lease = Open("fibermill.lease", _ctx(2), _ctx(1, remote=True), 1_765_000_000_000_000_000,
                 {"fibermill.index": 3})
    lease.set_status(StatusCode.ERROR, "failed")
    batch = Open("fibermill.batch", _ctx(3), lease.context, 1_765_000_000_100_000_000,
                 {"fibermill.batch.size": 32, "fibermill.steps": 4},
                 links=[Link(_ctx(9)), Link(_ctx(10, remote=True), {"why": "peer"})])
    root = Open("POST /v1/jobs", _ctx(4, state=TraceState([("vendor", "v1")])), None, 5,
                {"http.route": "/v1/jobs"}, kind=SpanKind.SERVER)
    ok = Open("fibermill.join", _ctx(5), root.context, 6, status=Status(StatusCode.OK))
    wire, sdk = _both([(lease, 1_765_000_001_000_000_000), (batch, 1_765_000_000_900_000_000),
                       (root, 7), (ok, 8)])
    assert wire == sdk
    assert len(wire.resource_spans[0].scope_spans[0].spans) == 4


def test_a_span_of_many_links_has_its_lengths_written_in_several_bytes():
    links = [Link(_ctx(100 + n)) for n in range(40)]  # a body past 127 bytes, and past 16 KiB
    wire, sdk = _both([(Open("fibermill.batch", _ctx(2), _ctx(1), 1, links=links), 2)] * 300)
    assert wire == sdk


def test_a_span_past_16_kib_has_its_length_written_in_three_bytes():
    wire, sdk = _both([(Open("x", _ctx(2), None, 1, {"big": "y" * 20_000}), 2)])
    assert wire == sdk


def test_attribute_values_written_once_and_kept_encode_with_their_own_types():
    # True == 1 == 1.0 as keys: one name given each in turn, and again, and other names alike
    values = [True, 1, 1.0, "1", 1, True, False, 0, "", 0.0, False, "1"]
    wire, sdk = _both([(Open("x", _ctx(2 + n), None, 1, {"v": v, "route": "/v1/jobs"}), 2)
                       for n, v in enumerate(values)])
    assert wire == sdk


def test_the_kept_values_are_let_go_when_there_are_too_many(monkeypatch):
    monkeypatch.setattr(otlp_wire, "_KEPT_MAX", 3)
    wire, sdk = _both([(Open("x", _ctx(2 + n), None, 1,
                             {"job": f"j{n}", "n": n, "even": n % 2 == 0}), 2)
                       for n in range(20)])
    assert wire == sdk
    assert max(map(len, (otlp_wire._kept_str, otlp_wire._kept_int))) <= 3


def test_an_id_is_written_each_time_rather_than_kept():
    job = "ab" * 16
    wire, sdk = _both([(Open("x", _ctx(2), None, 1, {"fibermill.job_id": job,
                                                     "http.route": "/v1/jobs"}), 2)])
    assert wire == sdk
    assert ("http.route", "/v1/jobs") in otlp_wire._kept_str
    assert ("fibermill.job_id", job) not in otlp_wire._kept_str


def test_shared_attributes_are_written_before_the_spans_own_and_kept_whole(monkeypatch):
    monkeypatch.setattr(otlp_wire, "_KEPT_MAX", 2)
    clients = [(("http.request.method", "POST"), ("server.port", 8000),
                ("user_agent.original", f"client/{n}" + "x" * 40)) for n in range(5)]
    spans = [(Open("POST /v1/jobs", _ctx(2 + n), None, 1, {"url.path": f"/v1/jobs/{n}"},
                   kind=SpanKind.SERVER, base=clients[n % 3]), 2) for n in range(9)]
    wire, sdk = _both(spans)
    assert wire == sdk
    first = wire.resource_spans[0].scope_spans[0].spans[0]
    assert [kv.key for kv in first.attributes] == [
        "http.request.method", "server.port", "user_agent.original", "url.path"]
    assert len(otlp_wire._bases) <= 2  # let go when there are too many, as the kept values
    assert otlp_wire._bases[clients[8 % 3]] == otlp_wire._base(clients[2])


def test_a_resource_and_scope_with_schema_urls_and_versions():
    resource = Resource({"service.name": "api"}, schema_url="https://opentelemetry.io/s/1.9")
    scope = InstrumentationScope("fibermill", "1.2.3", "https://example.com/s",
                                 {"scope.attr": "a"})
    wire, sdk = _both([(Open("x", _ctx(2), None, 1), 2)], resource, scope)
    assert wire == sdk


def test_an_attribute_otlp_has_no_value_for_is_left_out_not_the_span(caplog):
    span = Open("x", _ctx(2), None, 1, {"kept": 1, "bad": object()})  # type: ignore[dict-item]
    wire = ExportTraceServiceRequest.FromString(
        otlp_wire.request(RESOURCE, SCOPE, [otlp_wire.span(span, 2)]))
    (encoded,) = wire.resource_spans[0].scope_spans[0].spans
    assert [a.key for a in encoded.attributes] == ["kept"]
    assert "span attribute bad left out" in caplog.text
