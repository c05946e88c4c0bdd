"""Refuse request bodies over a size limit while they stream in, before anyone buffers them.

A declared Content-Length over the limit is refused before the app runs. Otherwise the bytes
are counted as the app receives them; the message that passes the limit is not handed on.
The 413 goes out at once, and the app is told the client went away, so whatever it does next
(FastAPI answers a lost body with a 400) never reaches the client.

A few routes take larger bodies (`larger`): a file upload (`POST /v1/files`) may be up to
`max_file_bytes`, plus what its multipart framing adds; the route itself checks the file's own
size against the limit.
"""

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.errors import render
from shared.errors import PayloadTooLarge
from shared.settings import get_settings

# What multipart framing (boundaries, part headers, the `purpose` field) may add to a file.
MULTIPART_SLACK = 64 * 1024


def default_larger() -> dict[tuple[str, str], tuple[int, str]]:
    """(method, path) -> (limit, what it limits) of the routes that take larger bodies."""
    limit = get_settings().max_file_bytes
    return {("POST", "/v1/files"): (
        limit + MULTIPART_SLACK,
        f"the file is larger than the limit of {limit} bytes (FIBERMILL_MAX_FILE_BYTES)")}


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server refuses a malformed length itself
    return None


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int,
                 larger: dict[tuple[str, str], tuple[int, str]] | None = None) -> None:
        self.app, self.max_bytes = app, max_bytes
        self.larger = default_larger() if larger is None else larger

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        limit, why = self.larger.get(
            (scope.get("method", ""), path.rstrip("/")),
            (self.max_bytes, f"request body is larger than the limit of {self.max_bytes} bytes"))
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await self._reject(send, path, why)
            return

        received = 0
        rejected = answered = started = False

        async def limited_receive() -> Message:
            nonlocal received, rejected, answered
            if rejected:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    rejected = True
                    if not started:  # else the app's own reply is under way; it must end it
                        await self._reject(send, path, why)
                        answered = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if answered:
                return  # the 413 is the answer; the app's reply to a vanished body is not
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            # The app may raise on the disconnect it was handed; the client has its 413.
            if not rejected:
                raise

    async def _reject(self, send: Send, path: str, why: str) -> None:
        status, payload, headers = render(PayloadTooLarge(why), path)
        body = json.dumps(payload).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    *((k.lower().encode(), v.encode()) for k, v in headers.items()),
                    # The rest of the body may still be on its way; this connection is done.
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
