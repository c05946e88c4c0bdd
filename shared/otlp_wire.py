"""Fibermill's spans in OTLP's protobuf wire format, written as bytes when each span ends.

The OTLP exporter's encoder builds a protobuf object for every span, attribute and link, and
then serializes them: about 14 us a span on this machine, more than making the span itself, and
done on the exporting process's interpreter beside its serving threads. Fibermill's spans have
one fixed shape (shared/open_span.py: ids, a name, a kind, two times, attributes of plain
values, links, a status), so here each is written straight into the bytes of an OTLP `Span`
(opentelemetry-proto's trace/v1/trace.proto, the field numbers below) as it ends, for a third
of that; an export is then the resource's and scope's header and the spans' bytes joined.

What a collector receives is what the SDK's own encoder makes of the same span
(tests/shared/test_otlp_wire.py parses both and compares them).
"""

import logging
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, StatusCode

from shared import open_span
from shared.open_span import Open

log = logging.getLogger(__name__)

_pack_double = struct.Struct("<d").pack

# Span.flags (field 16, fixed32): the SDK's encoder sets "has is_remote" always, and "is
# remote" for a span whose parent (a link: whose linked span) came from another process.
_LOCAL_FLAGS = b"\x85\x01" + (0x100).to_bytes(4, "little")
_REMOTE_FLAGS = b"\x85\x01" + (0x300).to_bytes(4, "little")
_LINK_LOCAL_FLAGS = b"\x35" + (0x100).to_bytes(4, "little")  # Link.flags, field 6
_LINK_REMOTE_FLAGS = b"\x35" + (0x300).to_bytes(4, "little")
# Span.kind (field 6): the API's SpanKind values are OTLP's less one (0 is "unspecified").
# Keyed by the member: an enum member's `.value` is a slow descriptor on this Python (and its
# hash a call in Python: the usual kind is told apart by identity first).
_KINDS = {kind: bytes((0x30, kind.value + 1)) for kind in SpanKind}
_INTERNAL = SpanKind.INTERNAL
_INTERNAL_KIND = _KINDS[_INTERNAL]
_UNSET = b"\x7a\x00"  # Status (15), as the SDK's encoder writes it unset: present, empty


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, body: bytes) -> bytes:
    """A length-delimited field: its tag, the body's length, the body."""
    n = len(body)
    if n < 0x80:
        return tag + bytes((n,)) + body
    if n < 0x4000:  # a span's length: two bytes
        return tag + bytes((n & 0x7F | 0x80, n >> 7)) + body
    return tag + _varint(n) + body


def _value(v: Any) -> bytes:
    """An AnyValue's fields (a oneof: set even when it is the type's zero)."""
    t = type(v)
    if t is str:
        return _field(b"\x0a", v.encode())
    if t is bool:
        return b"\x10\x01" if v else b"\x10\x00"
    if t is int:
        return b"\x18" + _varint(v if v >= 0 else v + (1 << 64))
    if t is float:
        return b"\x21" + _pack_double(v)
    # Else in the SDK encoder's order, for subclasses (enums of str or int) and containers.
    if v is None:
        return b""
    if isinstance(v, bool):
        return _value(bool(v))
    if isinstance(v, str):
        return _value(str.__str__(v))
    if isinstance(v, int):
        return _value(int.__index__(v))
    if isinstance(v, float):
        return _value(float(v))
    if isinstance(v, bytes):
        return _field(b"\x3a", v)
    if isinstance(v, Sequence):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _value(x)) for x in v))
    if isinstance(v, Mapping):
        return _field(b"\x32", _attributes(b"\x0a", {str(k): x for k, x in v.items()}))
    raise TypeError(f"a value of type {t.__name__} is not an OTLP value")


_keys: dict[str, bytes] = {}  # KeyValue.key fields, written once a name


def _attributes(tag: bytes, attributes: Mapping[str, Any]) -> bytes:
    """Repeated KeyValue fields under `tag`."""
    return b"".join([_kv(tag, k, v) for k, v in attributes.items()])


def _kv(tag: bytes, k: str, v: Any) -> bytes:
    """A KeyValue field under `tag`; as the SDK's encoder does, an attribute of a type OTLP has
    no value for is left out (and logged), not the span."""
    try:
        value = _value(v)
    except TypeError:
        log.exception("span attribute %s left out", k)
        return b""
    key = _keys.get(k)
    if key is None:
        key = _keys[k] = _field(b"\x0a", k.encode())
    return _field(tag, key + _field(b"\x12", value))


# A span's attributes repeat from one span to the next (a method, a route, a model, a worker,
# a batch size, an outcome): each pair of a name and a str, int or bool value is written once and
# kept, its Span.attributes field (9) whole. Keyed apart by the value's type, because True ==
# 1 == 1.0 as keys of one dict. A string longer than an address or a route is not kept: ids
# (a job's, 32 hex digits) and paths holding them never repeat. Emptied when full.
_KEPT_MAX = 4096
_KEPT_STR_MAX = 24
_kept_str: dict[tuple[str, Any], bytes] = {}
_kept_int: dict[tuple[str, Any], bytes] = {}
_kept_bool: dict[tuple[str, Any], bytes] = {}


def _span_attributes(attributes: Mapping[str, Any]) -> list[bytes]:
    out = []
    for item in attributes.items():
        t = type(item[1])
        if t is str:
            if len(item[1]) > _KEPT_STR_MAX:
                out.append(_kv(b"\x4a", *item))
                continue
            kept = _kept_str
        elif t is int:
            kept = _kept_int
        elif t is bool:
            kept = _kept_bool
        else:
            out.append(_kv(b"\x4a", *item))
            continue
        kv = kept.get(item)
        if kv is None:
            if len(kept) >= _KEPT_MAX:
                kept.clear()
            kv = kept[item] = _kv(b"\x4a", *item)
        out.append(kv)
    return out


_bases: dict[open_span.Base, bytes] = {}


def _base(base: open_span.Base) -> bytes:
    """A span's shared attributes (Open.base), written once a tuple of them and kept, emptied
    when full: one lookup for what would be a lookup an attribute."""
    kv = _bases.get(base)
    if kv is None:
        if len(_bases) >= _KEPT_MAX:
            _bases.clear()
        kv = _bases[base] = b"".join([_kv(b"\x4a", k, v) for k, v in base])
    return kv


# A link as a worker's batch span holds them, without trace state or attributes: fixed size.
_PLAIN_LINK = struct.Struct(">4sQQ2sQ5s").pack  # Span.links (13), 33 bytes
_LINK_HEAD = b"\x6a\x21\x0a\x10"


def _link(link: Link) -> bytes:
    ctx = link.context
    if not ctx.trace_state and not link.attributes:
        t = ctx.trace_id
        return _PLAIN_LINK(_LINK_HEAD, t >> 64, t & _LOW64, b"\x12\x08", ctx.span_id,
                           _LINK_REMOTE_FLAGS if ctx.is_remote else _LINK_LOCAL_FLAGS)
    body = (b"\x0a\x10" + ctx.trace_id.to_bytes(16, "big") + b"\x12\x08"
            + ctx.span_id.to_bytes(8, "big"))
    if ctx.trace_state:
        body += _field(b"\x1a", _trace_state(ctx))
    if link.attributes:
        body += _attributes(b"\x22", link.attributes)
    return _field(b"\x6a", body + (_LINK_REMOTE_FLAGS if ctx.is_remote else _LINK_LOCAL_FLAGS))


def _trace_state(ctx: SpanContext) -> bytes:
    return ",".join(f"{k}={v}" for k, v in ctx.trace_state.items()).encode()


_LOW64 = (1 << 64) - 1
_IDS = struct.Struct(">2sQQ2sQ").pack  # trace_id (1), span_id (2)
_PARENT = struct.Struct(">2sQ").pack  # parent_span_id (4)
_TIMES = struct.Struct("<BQBQ").pack  # start_time_unix_nano (7), end_time_unix_nano (8)
_names: dict[str, bytes] = {}  # Span.name fields (5), written once a name


def span(s: Open, end_ns: int) -> bytes:
    """`s`, ended at `end_ns`, as a ScopeSpans.spans field (2) holding an OTLP Span."""
    ctx, parent = s.context, s.parent
    t = ctx.trace_id
    parts = [_IDS(b"\x0a\x10", t >> 64, t & _LOW64, b"\x12\x08", ctx.span_id)]
    if ctx.trace_state:
        parts.append(_field(b"\x1a", _trace_state(ctx)))
    if parent is not None:
        parts.append(_PARENT(b"\x22\x08", parent.span_id))
    name = _names.get(s.name)
    if name is None:
        name = _field(b"\x2a", s.name.encode())
        if len(_names) < _KEPT_MAX:
            _names[s.name] = name
    kind = s.kind
    parts += (name, _INTERNAL_KIND if kind is _INTERNAL else _KINDS[kind],
              _TIMES(0x39, s.start_ns, 0x41, end_ns))
    if s.base:
        parts.append(_base(s.base))
    if s.attributes:
        parts += _span_attributes(s.attributes)
    for link in s.links:
        parts.append(_link(link))
    status = s.status
    if status is open_span.UNSET or (status.status_code is StatusCode.UNSET
                                     and not status.description):
        parts.append(_UNSET)
    else:
        code = status.status_code.value
        described = _field(b"\x12", status.description.encode()) if status.description else b""
        parts.append(_field(b"\x7a", described + (bytes((0x18, code)) if code else b"")))
    parts.append(_REMOTE_FLAGS if parent is not None and parent.is_remote else _LOCAL_FLAGS)
    return _field(b"\x12", b"".join(parts))


def request(resource: Resource, scope: InstrumentationScope, spans: Iterable[bytes]) -> bytes:
    """An ExportTraceServiceRequest of `spans` (from `span`), all of one resource and scope."""
    named = _field(b"\x0a", scope.name.encode())
    if scope.version:
        named += _field(b"\x12", scope.version.encode())
    if scope.attributes:
        named += _attributes(b"\x1a", scope.attributes)
    scope_spans = _field(b"\x0a", named) + b"".join(spans)
    if scope.schema_url:
        scope_spans += _field(b"\x1a", scope.schema_url.encode())
    resource_spans = (_field(b"\x0a", _attributes(b"\x0a", resource.attributes))
                      + _field(b"\x12", scope_spans))
    if resource.schema_url:
        resource_spans += _field(b"\x1a", resource.schema_url.encode())
    return _field(b"\x0a", resource_spans)
