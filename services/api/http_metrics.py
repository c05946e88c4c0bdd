"""HTTP request metrics: `fibermill_http_requests_total{method,route,code}` and
`fibermill_http_request_duration_seconds{method,route}`.

`route` is the path template of the route that handled the request (`/v1/jobs/{job_id}`, never
the raw path, which would give a series per job), `/static/{path}` for the static files, and
`unmatched` for a path no route serves, so label values stay bounded by the routes the app
has. `method` is one of the standard methods or `other`. Register this middleware outermost,
so it also counts answers given before routing (the body limit's 413) and unhandled errors
(500).
"""

import re
import time
import weakref

from starlette.routing import Mount, compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api import metrics

UNMATCHED = "unmatched"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def method_label(method: str) -> str:
    return method if method in METHODS else "other"


def route_template(route: object) -> str:
    if isinstance(route, Mount):
        return f"{route.path}/{{path}}"
    path = getattr(route, "path_format", None) or getattr(route, "path", None)
    return path if isinstance(path, str) and path else UNMATCHED


def route_label(scope: Scope, root_path_before: str) -> str:
    """The template of the route that handled the request. The router records its route in
    the scope; a mounted app (the static files) moves the scope's root_path by its prefix.
    A request answered before routing (the body limit's 413) gets the template of the
    documented route its path matches, else `unmatched`, as does a path no route serves."""
    if scope.get("route") is not None:
        return route_template(scope["route"])
    root_path = scope.get("root_path", "")
    if scope.get("endpoint") is not None and root_path != root_path_before:
        return f"{root_path.removeprefix(root_path_before)}/{{path}}"
    path = scope.get("path", "")
    for regex, template in _templates(scope.get("app")):
        if regex.match(path):
            return template
    return UNMATCHED


_TEMPLATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _templates(app: object) -> list[tuple[re.Pattern[str], str]]:
    """The app's documented path templates (its OpenAPI paths), compiled once per app."""
    if app is None or not hasattr(app, "openapi"):
        return []
    if app not in _TEMPLATES:
        try:
            paths = app.openapi().get("paths", {})
        except Exception:  # a label is never worth failing a request for
            paths = {}
        _TEMPLATES[app] = [(compile_path(p)[0], p) for p in paths]
    return _TEMPLATES[app]


class HttpMetricsMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        root_path = scope.get("root_path", "")
        code = 500  # an error before the response started is answered with a 500

        async def send_and_record(message: Message) -> None:
            nonlocal code
            if message["type"] == "http.response.start":
                code = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            # The router adds the matched route to this same scope as it dispatches.
            method, route = method_label(scope.get("method", "")), route_label(scope, root_path)
            metrics.HTTP_REQUESTS.labels(method, route, str(code)).inc()
            metrics.HTTP_DURATION.labels(method, route).observe(time.perf_counter() - start)
