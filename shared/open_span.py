"""A span of Fibermill's own, begun and not yet ended (shared/span_recorder.py makes and ends
them). Of the OpenTelemetry API alone: a process without tracing imports no SDK."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

UNSET = Status(StatusCode.UNSET)  # a span's status until one is set
# Attributes that many spans share as they are (a server span's method, scheme, addresses,
# user agent), as a tuple: its OTLP bytes are written once and kept (shared/otlp_wire.py).
Base: TypeAlias = tuple[tuple[str, AttributeValue], ...]


def merged(base: Base, attributes: dict[str, AttributeValue]) -> dict[str, AttributeValue]:
    """`base` and `attributes` as one span's attributes, a span's own last."""
    return {**dict(base), **attributes} if base else attributes


@dataclass(slots=True)
class Open:
    """A span begun and not yet ended: its context is known from the start, so its children,
    and the messages that carry its traceparent, can name it."""

    name: str
    context: SpanContext
    parent: SpanContext | None
    start_ns: int
    attributes: dict[str, AttributeValue] = field(default_factory=dict)
    links: Sequence[Link] = ()
    status: Status = UNSET
    kind: SpanKind = SpanKind.INTERNAL
    base: Base = ()  # before `attributes`, which are this span's own

    def all_attributes(self) -> dict[str, AttributeValue]:
        """`base` and `attributes`, as one span's attributes."""
        return merged(self.base, self.attributes)

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        self.attributes.update(attributes)

    def set_status(self, code: StatusCode, description: str | None = None) -> None:
        self.status = Status(code, description)
