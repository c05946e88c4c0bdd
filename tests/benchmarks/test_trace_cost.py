"""The tracing benchmark's parts: its receiver counts what a real OTLP exporter sends, and its
report states the ratio it measured."""

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from benchmarks.trace_cost import Side, SpanSink, report


def test_the_sink_counts_the_spans_an_exporter_sends():
    sink = SpanSink()
    # A provider of this test's own: the process-wide one stays the no-op tracer.
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(
        OTLPSpanExporter(endpoint=f"{sink.url}/v1/traces")))
    try:
        tracer = provider.get_tracer("test")
        for name in ("a", "b", "c"):
            with tracer.start_as_current_span(name):
                pass
        assert sink.spans == 3
    finally:
        provider.shutdown()
        sink.close()


def test_the_report_states_each_side_and_the_ratio():
    sides = {True: Side("traced", [96.0, 98.0], [0.30, 0.31], [12.0, 12.0]),
             False: Side("not traced", [100.0, 100.0], [0.29, 0.30], [0.0, 0.0])}
    text = "\n".join(report({"jobs": 40, "rounds": 2, "sides": sides, "ratio": 0.97,
                             "ratios": [0.96, 0.98]}))
    assert "| traced | 97.0 | 96.0, 98.0 | 305 | 12.0 |" in text
    assert "**0.97x**" in text and "0.96, 0.98" in text
