"""A scripted stand-in for the API, for what the real stack does not show on demand: a given
sequence of events, an error body of the next API version, a 404 from a path it does not serve.
It is a real HTTP server, so the CLI runs as a real process against it."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GATE_SECONDS = 60  # a gate never opened (a failing test) stops holding its stream after this


class FakeApi:
    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], tuple[int, object]] = {}
        self.streams: dict[str, list] = {}
        self.bodies: list[dict] = []  # the JSON bodies of the POSTs, in order
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                api._answer(self)

            do_POST = do_GET

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def answer(self, method: str, path: str, body: object, status: int = 200) -> None:
        self.answers[(method, path)] = (status, body)

    def stream(self, path: str, script: list) -> None:
        """Server-sent events: (event, data) pairs, and `threading.Event` gates that hold the
        rest of the stream until a test opens them."""
        self.streams[path] = script

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

    def _answer(self, h: BaseHTTPRequestHandler) -> None:
        path = h.path.split("?")[0]
        if h.command == "POST":
            raw = h.rfile.read(int(h.headers.get("Content-Length") or 0))
            self.bodies.append(json.loads(raw or b"{}"))
        if h.command == "GET" and path in self.streams:
            self._stream(h, self.streams[path])
            return
        # What Starlette answers for a path no route serves.
        status, body = self.answers.get((h.command, path), (404, {"detail": "Not Found"}))
        data = json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _stream(self, h: BaseHTTPRequestHandler, script: list) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        for item in script:
            if isinstance(item, threading.Event):
                item.wait(GATE_SECONDS)
                continue
            event, data = item
            h.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
            h.wfile.flush()
