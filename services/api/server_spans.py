"""A server span for each HTTP request when tracing is on: the root of a job's trace (or a
child of the caller's `traceparent`), and the job's submit span too when the request submits
one (tracing.submitted: a job's trace is a span shorter).

Not FastAPI's OpenTelemetry instrumentation, which made the same span at 136 us of CPU a
request against 46 us for the whole `POST` of an app of one route (benchmarks/span_work.py): it
matches every route again to name the span before the request runs, collects a dozen
attributes through helper layers and records three metrics nobody reads here; on tiny-gpt2 that
was about 5% of a job's CPU by itself. This one is made by shared/span_recorder.py like
Fibermill's other spans, named once the request is over from the route Starlette matched
(`scope["route"]`), with the stable HTTP semantic conventions' attributes.

Not for the probes and scrapes (each would make a trace of its own every few seconds), nor a
span per ASGI message of a long response. `OTEL_PYTHON_FASTAPI_EXCLUDED_URLS` (comma-separated
regular expressions searched in the path) replaces the excluded list, and
`OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=fastapi` turns the server spans off, as they did for the
instrumentation.
"""

import os
import re
from collections.abc import Mapping

from opentelemetry.trace import StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared import tracing
from shared.open_span import Base

_EXCLUDED = "/healthz$,/readyz$,/metrics$"


def excluded_paths(env: Mapping[str, str] = os.environ) -> re.Pattern[str] | None:
    patterns = [p.strip() for p in env.get("OTEL_PYTHON_FASTAPI_EXCLUDED_URLS",
                                           _EXCLUDED).split(",") if p.strip()]
    return re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None


class ServerSpans:
    def __init__(self, app: ASGIApp, excluded: re.Pattern[str] | None = None) -> None:
        self.app = app
        self.excluded = excluded

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (self.excluded is not None
                                       and self.excluded.search(scope["path"])):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        caller = headers.get(b"traceparent")
        status = 0

        async def sent(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        method = scope["method"]
        with tracing.request(method, caller.decode("latin-1") if caller else None,
                             {"url.path": scope["path"]}, _shared_attributes(scope, headers)
                             ) as span:
            try:
                await self.app(scope, receive, sent)
            except Exception as exc:
                # Starlette's outermost middleware, outside this one, answers it with a 500.
                if span is not None:
                    span.attributes["error.type"] = type(exc).__qualname__
                status = status or 500
                raise
            finally:
                if span is not None:
                    route = getattr(scope.get("route"), "path", None)
                    if route:
                        span.name = f"{method} {route}"
                        span.attributes["http.route"] = route
                    if status:
                        span.attributes["http.response.status_code"] = status
                    if status >= 500:
                        span.set_status(StatusCode.ERROR)


# A request's attributes but its path, by what they are made from: the same for every request
# of a client, so built once and written once (Open.base), rather than each an attribute to
# look up and write again a request. Emptied when full.
_SHARED_MAX = 1024
_shared: dict[tuple, Base] = {}


def _shared_attributes(scope: Scope, headers: dict[bytes, bytes]) -> Base:
    server, client = scope.get("server"), scope.get("client")
    key = (scope["method"], scope.get("scheme", "http"), scope.get("http_version", "1.1"),
           tuple(server) if server else None,  # a list from some servers: made a key
           client[0] if client else None, headers.get(b"user-agent"))
    base = _shared.get(key)
    if base is None:
        if len(_shared) >= _SHARED_MAX:
            _shared.clear()
        base = _shared[key] = _request_attributes(*key)
    return base


def _request_attributes(method: str, scheme: str, version: str,
                        server: tuple[str, int | None] | None, client: str | None,
                        agent: bytes | None) -> Base:
    attributes: list[tuple[str, str | int]] = [
        ("http.request.method", method), ("url.scheme", scheme),
        ("network.protocol.version", version)]
    if server:
        attributes.append(("server.address", server[0]))
        if server[1] is not None:
            attributes.append(("server.port", server[1]))
    if client:
        attributes.append(("client.address", client))
    if agent:
        attributes.append(("user_agent.original", agent.decode("latin-1")))
    return tuple(attributes)
