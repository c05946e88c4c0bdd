"""An OTLP/HTTP trace receiver for the tests: a small HTTP server that decodes what the
services export (opentelemetry-proto's ExportTraceServiceRequest) and keeps each span with the
service that sent it. It takes the job's webhook too, so one server sees the whole trace."""

import gzip
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass
class Span:
    service: str
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, object]
    links: list[tuple[str, str]] = field(default_factory=list)  # (trace id, span id)


def _value(v: AnyValue) -> object:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def decode(body: bytes) -> list[Span]:
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    out = []
    for rs in req.resource_spans:
        attrs = {a.key: _value(a.value) for a in rs.resource.attributes}
        service = str(attrs.get("service.name", ""))
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(Span(
                    service, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.name,
                    s.start_time_unix_nano, s.end_time_unix_nano,
                    {a.key: _value(a.value) for a in s.attributes},
                    [(link.trace_id.hex(), link.span_id.hex()) for link in s.links]))
    return out


class Receiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.webhooks: list[dict] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                with receiver.lock:
                    if self.path == "/v1/traces":
                        receiver.spans += decode(body)
                        reply = ExportTraceServiceResponse().SerializeToString()
                    else:
                        receiver.webhooks.append(json.loads(body))
                        reply = b""
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *_args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Receiver":
        self.thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def trace(self, trace_id: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]
