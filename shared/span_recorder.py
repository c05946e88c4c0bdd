"""Fibermill's own spans, made from their times and handed straight to the span processors.

The SDK's `Tracer.start_span` guards every caller: it validates and copies each attribute, takes
a lock per span, applies limits and asks the sampler, some 20-25 us a span on this machine
before its export. Fibermill's spans are of a shape it knows (a name, two times, a few
attributes of plain types, a parent it holds as ids: shared/open_span.py), and most are
recorded once what they cover is over. Here a span is only that: its context (ids from the
provider's id generator), written at its end as OTLP bytes for the export over HTTP
(shared/otlp_wire.py, shared/span_export.py), or made into the SDK's own `ReadableSpan` for
any other processor (another exporter, a test's), so a collector sees no difference
(docs/architecture.md, "Tracing", has the figures).

Sampling is the provider's: a child of a parent follows the parent's sampled flag, as every
parent-based sampler does (the SDK's default, and every `OTEL_TRACES_SAMPLER` named
`parentbased_*`); a root, or any span under another sampler, asks the sampler itself. A span
not sampled still has a context, so its children know to make nothing either.
"""

from collections.abc import Mapping, Sequence
from typing import Protocol

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.util.types import AttributeValue

from shared import otlp_wire
from shared.open_span import Base, Open, merged


class Emits(Protocol):
    """Where encoded spans go (shared/span_export.py's WireSpans)."""

    def emit(self, encoded: bytes) -> None: ...


_SAMPLED, _NOT_SAMPLED = TraceFlags(TraceFlags.SAMPLED), TraceFlags(TraceFlags.DEFAULT)


class _KeptHash(Resource):
    """The provider's resource with its hash computed once: the OTLP encoder groups the spans
    of an export by resource, hashing it once a span, and a resource hashes as a JSON dump of
    all its attributes (6 us, a third of what encoding the span itself costs). Equal to the
    provider's resource, with the same hash, so the SDK's spans and these share one group."""

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource.attributes, resource.schema_url)
        self._hash = hash(resource)

    def __hash__(self) -> int:
        return self._hash


class Recorder:
    """Makes spans for `provider` and hands each, once ended, to `processors` as the SDK's
    `ReadableSpan`, and to `wire` (shared/span_export.py) as OTLP bytes."""

    def __init__(self, provider: TracerProvider, processors: Sequence[SpanProcessor],
                 scope: str, wire: Emits | None = None) -> None:
        self._processors = tuple(processors)
        self._wire = wire
        self._resource = _KeptHash(provider.resource)
        self._scope = InstrumentationScope(scope)
        self._sampler = provider.sampler
        self._follows_parent = isinstance(provider.sampler, ParentBased)
        # The SDK's default, parentbased_always_on, samples every root: asking it costs a root
        # span (the API's, one a job) as much as making it.
        self._roots_sampled = (type(provider.sampler) is ParentBased and
                               provider.sampler.get_description()
                               == ParentBased(ALWAYS_ON).get_description())
        self._ids = provider.id_generator
        # OTEL_SPAN_LINK_COUNT_LIMIT, as the SDK's spans keep it (a batch leader's links)
        self._max_links = SpanLimits().max_links

    def may_sample(self, parent: SpanContext) -> bool:
        """Whether a span under `parent` may be sampled: never under a parent not sampled
        when the sampler follows the parent."""
        return parent.trace_flags.sampled or not self._follows_parent

    def open(self, name: str, parent: SpanContext | None, start_ns: int,
             attributes: Mapping[str, AttributeValue] | None = None,
             links: Sequence[Link] = (), kind: SpanKind = SpanKind.INTERNAL,
             base: Base = ()) -> Open:
        attrs = dict(attributes) if attributes else {}
        if self._max_links is not None and len(links) > self._max_links:
            links = links[:self._max_links]
        if parent is not None and parent.is_valid:
            trace_id, state = parent.trace_id, parent.trace_state
        else:
            parent, trace_id, state = None, self._ids.generate_trace_id(), None
        if parent is not None and self._follows_parent:
            sampled = parent.trace_flags.sampled
        elif parent is None and self._roots_sampled:
            sampled = True
        else:
            ctx = None if parent is None else trace.set_span_in_context(NonRecordingSpan(parent))
            verdict = self._sampler.should_sample(ctx, trace_id, name, kind,
                                                  merged(base, attrs), links)
            sampled, state = verdict.decision.is_sampled(), verdict.trace_state
        context = SpanContext(trace_id, self._ids.generate_span_id(), is_remote=False,
                              trace_flags=_SAMPLED if sampled else _NOT_SAMPLED,
                              trace_state=state)
        return Open(name, context, parent, start_ns, attrs, links, kind=kind, base=base)

    def close(self, span: Open, end_ns: int) -> None:
        if not span.context.trace_flags.sampled:
            return
        if self._wire is not None:
            self._wire.emit(otlp_wire.span(span, end_ns))
        if not self._processors:
            return
        done = ReadableSpan(name=span.name, context=span.context, parent=span.parent,
                            resource=self._resource, attributes=span.all_attributes(),
                            links=span.links, kind=span.kind, status=span.status,
                            start_time=span.start_ns,
                            end_time=end_ns, instrumentation_scope=self._scope)
        for processor in self._processors:
            processor.on_end(done)
