"""OpenTelemetry tracing: one trace per job, from its POST to its webhook.

Set up from the standard `OTEL_*` variables alone (the SDK's own: exporter, endpoint, protocol,
headers, sampler, batch processor, resource) and off unless they name an exporter: with none,
no SDK is installed, and every helper here returns at its first check of one flag, so a stack
without tracing makes no span objects.

A job's trace context is a W3C `traceparent` carried in the typed messages (the job's stored
meta, each `SubRequest`), not in Celery's headers alone: the API pushes a new job's messages
itself (create_job.lua) rather than publishing them through Celery, the janitor and a draining
worker send them again hours later, and each side's spans must find the job's trace from what
it holds. Its Celery message carries the same `traceparent` header, for Celery-aware tools.

Fibermill's spans, the HTTP server spans included (services/api/server_spans.py), are made by
shared/span_recorder.py rather than the SDK's tracer, which costs several times as much a span.
"""

import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.context import attach, detach
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    StatusCode,
    TraceFlags,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from shared.open_span import Base, Open

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

    from shared.span_export import WireSpans
    from shared.span_recorder import Emits, Recorder

log = logging.getLogger(__name__)

Attributes = Mapping[str, AttributeValue]
# What a span's parent may be given as: one of Fibermill's spans (open, or the context of one
# ended), an SDK span, or a traceparent.
Parent = Open | SpanContext | Span | str | None

_PROPAGATOR = TraceContextTextMapPropagator()
_TRACER_NAME = "fibermill"
_on = False  # set once, by `setup`, when the OTEL_* variables name an exporter
_recorder: "Recorder | None" = None  # Fibermill's own spans (shared/span_recorder.py)
# The HTTP request's server span, while it is served (`request`), and the attribute that a
# job's submit sets on it when it takes it (`submitted`), its id once the job is stored.
_request: ContextVar["Open | None"] = ContextVar("fibermill_request_span", default=None)
_TAKEN = "fibermill.job_id"


def wanted(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the OTEL_* variables ask for traces: an exporter named (other than `none`), or
    an OTLP endpoint given (the spec's default exporter is OTLP); never with
    OTEL_SDK_DISABLED=true."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return exporters != "none"
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def setup(service: str, env: Mapping[str, str] = os.environ) -> bool:
    """Install the SDK for this process when the OTEL_* variables ask for traces; `service`
    names it unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES do. Returns whether tracing
    is on. Once per process: a second call changes nothing."""
    if _on or not wanted(env):
        return _on
    # The SDK is imported only here: a process without tracing never loads it.
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    named = env.get("OTEL_SERVICE_NAME") or "service.name=" in env.get(
        "OTEL_RESOURCE_ATTRIBUTES", "")
    provider = TracerProvider(resource=Resource.create({} if named else {"service.name": service}))
    exporters = _exporters(env)
    wire = _wire(exporters, provider)
    processors = [BatchSpanProcessor(exporter) for exporter in exporters] if wire is None else []
    for processor in [wire] if wire is not None else processors:
        provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    install(provider, processors, wire)
    log.info("tracing on: spans of %s exported (%s)", service,
             env.get("OTEL_TRACES_EXPORTER") or "otlp")
    return True


def install(provider: "TracerProvider", processors: Sequence["SpanProcessor"],
            wire: "Emits | None" = None) -> None:
    """Fibermill's spans made for `provider` and handed to `processors` (or, encoded, to
    `wire`), tracing on: `setup` does so with the process's SDK; a test or a benchmark with a
    provider of its own, which never becomes the process's global one."""
    global _on, _recorder
    from shared.span_recorder import Recorder

    _recorder = Recorder(provider, processors, _TRACER_NAME, wire)
    _on = True


def _wire(exporters: list, provider: "TracerProvider") -> "WireSpans | None":
    """With OTLP over HTTP the only exporter (the default), spans are encoded as they end and
    sent in batches by shared/span_export.py; other exporters take the SDK's spans."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    from shared.span_export import WireSpans

    if len(exporters) != 1 or not isinstance(exporters[0], OTLPSpanExporter):
        return None
    return WireSpans(exporters[0], provider.resource, InstrumentationScope(_TRACER_NAME))


def _exporters(env: Mapping[str, str]) -> list:
    names = [n.strip() for n in (env.get("OTEL_TRACES_EXPORTER") or "otlp").lower().split(",")]
    out = []
    for name in filter(None, names):
        if name == "otlp":
            out.append(_otlp(env))
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            out.append(ConsoleSpanExporter())
        elif name != "none":
            raise ValueError(f"OTEL_TRACES_EXPORTER: {name!r} is not one of otlp, console, none")
    return out


def _otlp(env: Mapping[str, str]):
    """The OTLP exporter of the protocol asked (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else
    OTEL_EXPORTER_OTLP_PROTOCOL; http/protobuf by default, as the spec recommends); it reads
    its endpoint, headers, timeout, compression and certificates from the variables itself."""
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip().lower()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        return OTLPSpanExporter()
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )
        return HttpExporter()
    raise ValueError(f"OTLP protocol {protocol!r}: this SDK exports grpc or http/protobuf")


def enabled() -> bool:
    return _on


def instrumenting(library: str, env: Mapping[str, str] = os.environ) -> bool:
    """Whether to make `library`'s spans (`fastapi`: the HTTP server spans): tracing is on and
    OTEL_PYTHON_DISABLED_INSTRUMENTATIONS (the auto-instrumentation's own variable) does not
    name it."""
    disabled = {n.strip().lower() for n in
                env.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "").split(",")}
    return _on and library not in disabled and "*" not in disabled


# Trace context as text ------------------------------------------------------------------------


def traceparent_of(span: Open | Span | SpanContext | None) -> str | None:
    """The W3C traceparent naming `span` as the parent, or None for no span."""
    if span is None:
        return None
    ctx = _span_context(span)
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def current_traceparent() -> str | None:
    """The traceparent of the span current here (None with tracing off, or outside a span)."""
    if not _on:
        return None
    return traceparent_of(trace.get_current_span())


def trace_id(traceparent: str | None) -> str | None:
    """The trace id (32 hex digits) a traceparent names."""
    if not traceparent:
        return None
    parts = traceparent.split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else None


def span_context_of(traceparent: str | None) -> SpanContext | None:
    """The remote span a traceparent names (version 00: `00-<trace>-<span>-<flags>`), read
    without the propagator's regular expressions, which cost more than the span made from it;
    None for none or a malformed one."""
    if not traceparent or len(traceparent) != 55:
        return None
    try:
        version, trace_hex, span_hex, flags = traceparent.split("-")
        ctx = SpanContext(int(trace_hex, 16), int(span_hex, 16), is_remote=True,
                          trace_flags=TraceFlags(int(flags, 16)))
    except ValueError:
        return None
    return ctx if version == "00" and ctx.is_valid else None


def parent_of(parent: Parent) -> SpanContext | None:
    """The span context `parent` names, or None for none (or a traceparent not understood)."""
    if parent is None or parent == "":
        return None
    if isinstance(parent, str):
        ctx = span_context_of(parent)
        if ctx is None:
            ctx = trace.get_current_span(_PROPAGATOR.extract({"traceparent": parent})
                                         ).get_span_context()
    else:
        ctx = _span_context(parent)
    return ctx if ctx.is_valid else None


def _span_context(span: Open | Span | SpanContext) -> SpanContext:
    if isinstance(span, Open):
        return span.context
    if isinstance(span, SpanContext):
        return span
    return span.get_span_context()


# Spans ----------------------------------------------------------------------------------------


def ns(seconds: float) -> int:
    """Epoch seconds as the SDK's nanoseconds."""
    return int(seconds * 1e9)


class _Current:
    """A span current around a block (`span`, `request`): entered, it is attached as the
    OpenTelemetry context's current span, and the request's span too when it is one; left, it
    ends, failed if an exception left the block. A class rather than a generator: it is on
    every traced request's path, and a generator's context manager costs several times as much
    to enter and leave."""

    __slots__ = ("_request", "_request_token", "_token", "span")

    def __init__(self, s: Open, request: bool = False) -> None:
        self.span = s
        self._request = request

    def __enter__(self) -> Open:
        self._token = attach(trace.set_span_in_context(NonRecordingSpan(self.span.context)))
        if self._request:
            self._request_token = _request.set(self.span)
        return self.span

    def __exit__(self, _kind: object, exc: BaseException | None, _tb: object) -> None:
        s = self.span
        if exc is not None:
            s.set_status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}")
        if self._request:
            _request.reset(self._request_token)
        detach(self._token)
        if _recorder is not None:
            _recorder.close(s, time.time_ns())


_NO_SPAN: AbstractContextManager[None] = nullcontext()


def span(name: str, parent: Parent = None, attributes: Attributes | None = None,
         kind: SpanKind = SpanKind.INTERNAL) -> AbstractContextManager[Open | None]:
    """A span around the block, the current one inside it; a child of `parent`, else of the
    current span, else the root of a new trace. Yields None with tracing off. An exception
    leaving the block marks it failed."""
    if _recorder is None:
        return _NO_SPAN
    return _Current(_recorder.open(name, _under(parent), time.time_ns(), attributes, kind=kind))


def request(name: str, parent: Parent, attributes: Attributes, base: Base = ()
            ) -> AbstractContextManager[Open | None]:
    """An HTTP request's server span (services/api/server_spans.py): `span`, kind server, that
    a job submitted inside it takes as its own (`submitted`); `base`: attributes it shares
    with other requests' (Open.base)."""
    if _recorder is None:
        return _NO_SPAN
    return _Current(_recorder.open(name, _under(parent), time.time_ns(), attributes,
                                   kind=SpanKind.SERVER, base=base), request=True)


def _under(parent: Parent) -> SpanContext | None:
    return parent_of(parent) if parent is not None else parent_of(trace.get_current_span())


class _Taken:
    """The request's span, taken by a job's submit for the block (`submitted`)."""

    __slots__ = ("span",)

    def __init__(self, s: Open) -> None:
        self.span = s

    def __enter__(self) -> Open:
        return self.span

    def __exit__(self, *_exc: object) -> None:
        if not self.span.attributes[_TAKEN]:  # refused: no job, no id
            del self.span.attributes[_TAKEN]


def submitted(name: str, attributes: Attributes) -> AbstractContextManager[Open | None]:
    """The span of a job's submit, the parent of all its other spans: the HTTP request's
    server span when the job is the request's first (it covers the submit already, so a job
    costs a span fewer), else a span `name` of its own under whatever is current (a batch's
    lines, a request of several jobs). Yields None with tracing off."""
    own = _request.get()
    if own is not None and _TAKEN not in own.attributes:
        own.attributes[_TAKEN] = ""
        own.attributes.update(attributes)
        return _Taken(own)
    return span(name, attributes=attributes)


def continued(traceparent: str | None) -> AbstractContextManager[None]:
    """Inside the block, spans without a parent of their own continue the trace `traceparent`
    names (a caller's W3C header), unless a span is current already (the request's server
    span, which read the same header)."""
    # No header (most callers) is told first: the current span is looked up only for one.
    if not traceparent or not _on or trace.get_current_span().get_span_context().is_valid:
        return _NO_SPAN
    return _continuing(traceparent)


@contextmanager
def _continuing(traceparent: str) -> Iterator[None]:
    ctx = parent_of(traceparent)
    token = (attach(trace.set_span_in_context(NonRecordingSpan(ctx))) if ctx is not None
             else None)
    try:
        yield
    finally:
        if token is not None:
            detach(token)


def may_sample(parent: SpanContext | None) -> bool:
    """Whether spans under `parent` may be exported: tracing on, a parent, and not one that
    was not sampled under a sampler that follows the parent (the default): a caller that makes
    several spans under one parent can skip them all at once."""
    return _recorder is not None and parent is not None and _recorder.may_sample(parent)


def start(name: str, parent: Parent, at: float | None = None,
          attributes: Attributes | None = None) -> Open | None:
    """A span begun at `at` (epoch seconds; now by default) under `parent`, ended by `end`;
    None with tracing off or without a parent (a job stored without tracing)."""
    if _recorder is None:
        return None
    under = parent_of(parent)
    if under is None:
        return None
    return _recorder.open(name, under, time.time_ns() if at is None else ns(at), attributes)


def end(s: Open | None, at: float | None = None, attributes: Attributes | None = None) -> None:
    if s is None or _recorder is None:
        return
    if attributes:
        s.set_attributes(attributes)
    _recorder.close(s, time.time_ns() if at is None else ns(at))


def record(name: str, parent: Parent, start_at: float, end_at: float | None = None,
           attributes: Attributes | None = None,
           links: Sequence[Link] = ()) -> SpanContext | None:
    """A span of what already happened, from `start_at` to `end_at` (epoch seconds; now by
    default), under `parent`; its context is returned to parent others."""
    if _recorder is None:
        return None
    under = parent_of(parent)
    if under is None:
        return None
    s = _recorder.open(name, under, ns(start_at), attributes, links)
    _recorder.close(s, time.time_ns() if end_at is None else ns(end_at))
    return s.context


def link_to(s: Open | SpanContext | None) -> Link | None:
    if s is None:
        return None
    ctx = _span_context(s)
    return Link(ctx) if ctx.is_valid and ctx.trace_flags.sampled else None
