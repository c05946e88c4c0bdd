"""Fibermill's spans sent over OTLP/HTTP as wire bytes (shared/span_export.py) reach a real
receiver (an HTTP server decoding the protobuf), batched by the SDK's batch processor and sent by
the OTLP exporter's client with its settings; a span another library makes through the SDK's
tracer goes the same way. A provider of the test's own, never the process's global one."""

import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from shared import tracing
from shared.span_export import WireSpans
from tests.e2e.otlp_receiver import Receiver

CALLER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def receiver():
    with Receiver() as r:
        yield r


@pytest.fixture
def off_afterwards(monkeypatch):
    monkeypatch.setattr(tracing, "_recorder", None)
    monkeypatch.setattr(tracing, "_on", False)


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_spans_reach_the_receiver_under_their_parents(receiver, off_afterwards, compression):
    otlp = OTLPSpanExporter(endpoint=f"{receiver.url}/v1/traces", compression=compression)
    provider = TracerProvider(resource=Resource.create({"service.name": "fibermill-worker"}))
    wire = WireSpans(otlp, provider.resource, InstrumentationScope("fibermill"))
    provider.add_span_processor(wire)
    tracing.install(provider, [], wire)
    lease = tracing.start("fibermill.lease", CALLER, 10.0, {"fibermill.index": 1})
    tracing.record("fibermill.batch", lease, 10.5, 11.0, {"fibermill.batch.size": 2},
                   links=[tracing.link_to(lease)])
    tracing.end(lease, 12.0, {"fibermill.outcome": "succeeded"})
    with provider.get_tracer("another.library").start_as_current_span("theirs"):
        pass
    assert wire.force_flush(10_000)
    spans = {s.name: s for s in receiver.trace(tracing.trace_id(CALLER))}
    assert set(spans) == {"fibermill.lease", "fibermill.batch"}
    lease_span, batch = spans["fibermill.lease"], spans["fibermill.batch"]
    assert lease_span.parent_id == "00f067aa0ba902b7" and batch.parent_id == lease_span.span_id
    assert lease_span.service == "fibermill-worker"
    assert lease_span.attributes == {"fibermill.index": 1, "fibermill.outcome": "succeeded"}
    assert (batch.start_ns, batch.end_ns) == (10_500_000_000, 11_000_000_000)
    assert batch.links == [(lease_span.trace_id, lease_span.span_id)]
    assert [s.name for s in receiver.spans if s.name == "theirs"] == ["theirs"]
    provider.shutdown()


def test_setup_sends_over_http_as_wire_bytes_and_other_exporters_take_sdk_spans(
        receiver, off_afterwards, monkeypatch):
    made = []
    monkeypatch.setattr(tracing, "install", lambda p, processors, wire=None:
                        made.append((processors, wire)))
    monkeypatch.setattr(tracing.trace, "set_tracer_provider", lambda _p: None)
    assert tracing.setup("api", {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url})
    ((processors, wire),) = made
    assert processors == [] and isinstance(wire, WireSpans)
    made.clear()
    assert tracing.setup("api", {"OTEL_TRACES_EXPORTER": "otlp,console",
                                 "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url})
    ((processors, wire),) = made
    assert len(processors) == 2 and wire is None
    made.clear()
    assert tracing.setup("api", {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
                                 "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    ((processors, wire),) = made
    assert len(processors) == 1 and wire is None
