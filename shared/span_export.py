"""The export of Fibermill's spans when they go over OTLP/HTTP (the spec's default protocol):
written as wire bytes when each ends (shared/otlp_wire.py), queued, batched and timed by the
SDK's own batch processor (OTEL_BSP_* as for any span: queue size, batch size, delay, the
flush at shutdown, the reset in a forked child), and sent by the OTLP exporter's HTTP client
(OTEL_EXPORTER_OTLP_* as for any span: endpoint, headers, compression, certificates, timeout,
retries). What the SDK's path would add between the two, a `ReadableSpan` a span and the
encoder's protobuf objects, is the part of a span's cost that this leaves out.
"""

from collections.abc import Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from shared import otlp_wire


class _Post(SpanExporter):
    """Sends a batch of encoded spans as one export request through `otlp`'s HTTP client."""

    def __init__(self, otlp: OTLPSpanExporter, resource: Resource,
                 scope: InstrumentationScope) -> None:
        self._otlp = otlp
        self._resource = resource
        self._scope = scope

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        """`spans`: Fibermill's, encoded (bytes), and any made through the SDK's tracer by
        another library (ReadableSpan), each kind sent as a request of its own."""
        encoded = [s for s in spans if isinstance(s, bytes)]
        others = [s for s in spans if not isinstance(s, bytes)]
        ok = True
        if encoded:
            ok = self._send(otlp_wire.request(self._resource, self._scope, encoded))
        if others:
            ok = self._send(encode_spans(others).SerializePartialToString()) and ok
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def _send(self, data: bytes) -> bool:
        # The exporter's client (opentelemetry-exporter-http-transport, pinned with the SDK) is
        # what its own `export` sends through once it has encoded ReadableSpans.
        return self._otlp._client.export(data).success

    def shutdown(self) -> None:
        self._otlp.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class WireSpans(BatchSpanProcessor):
    """A batch processor of spans already encoded (`emit`), sent through `otlp`; the
    provider's spans, if another library makes any, go through it too (`on_end`)."""

    def __init__(self, otlp: OTLPSpanExporter, resource: Resource,
                 scope: InstrumentationScope) -> None:
        super().__init__(_Post(otlp, resource, scope))

    def emit(self, encoded: bytes) -> None:
        # Its queue holds what its exporter (_Post) is given: bytes beside any ReadableSpan.
        self._batch_processor.emit(encoded)  # type: ignore[arg-type]
