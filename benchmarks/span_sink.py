"""An OTLP/HTTP receiver in a process of its own, for benchmarks/trace_cost.py: it takes what
the traced stacks export and counts their spans, like a collector that keeps nothing.

    python -m benchmarks.span_sink PORT

`POST /v1/traces` keeps the request's body; `GET /spans` decodes what it holds and answers
the count so far. A collector runs apart from the stack and from whatever loads it: in the load
generator's process, its threads would take that interpreter's lock from the clients whenever
an export came in, and the traced stacks' jobs/s would pay for it. Bodies are decoded when
counted, after a burst, so the stack's turn is not shared with decoding either."""

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def count(body: bytes) -> int:
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    return sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)


def serve(port: int) -> None:
    bodies: list[bytes] = []
    counted = 0
    lock = threading.Lock()
    reply = ExportTraceServiceResponse().SerializeToString()

    class Handler(BaseHTTPRequestHandler):
        # Connections kept open between exports, as a collector keeps them: over HTTP/1.0
        # every export would connect anew and pay for it in the traced stack.
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            with lock:
                bodies.append(body)
            self._answer(reply, "application/x-protobuf")

        def do_GET(self) -> None:
            nonlocal counted
            with lock:
                held = bodies[:]
                bodies.clear()
                counted += sum(count(b) for b in held)
                self._answer(str(counted).encode(), "text/plain")

        def _answer(self, body: bytes, kind: str) -> None:
            self.send_response(200)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
