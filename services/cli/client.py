"""A small client for the Fibermill HTTP API."""

from collections.abc import Iterator
from typing import Any

import httpx

from services.cli.sse import parse_events

TASK_TAGS = {"image-generation", "text-generation"}


class Unreachable(Exception):
    """No answer from the API: nothing answered at the URL, or the connection broke."""


class NotTheApi(Exception):
    """Something answered at the URL, but not the API: most often --url has a path too many.
    Not an `Unreachable`, which a job's follower waits out: this does not get better."""


class ApiError(Exception):
    """The API answered with an error status."""

    def __init__(self, status: int, message: str,
                 fields: list[tuple[str, str]] | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.fields = fields or []  # (field, problem) in the API's order; a field may recur
        self.retry_after = retry_after


def field_name(loc: list) -> str:
    """["body", "image-generation", "input", "width"] -> "input.width"."""
    parts = [str(p) for p in loc]
    if parts[:1] == ["body"]:
        parts = parts[1:]
    if parts[:1] and parts[0] in TASK_TAGS:
        parts = parts[1:]
    return ".".join(parts) or "request"


def _base_form(url: httpx.URL) -> str:
    return f"{url.scheme}://{url.netloc.decode()}"


def _not_the_api(resp: httpx.Response, why: str) -> NotTheApi:
    request = resp.request
    return NotTheApi(f"{request.method} {request.url} answered {why}: is --url the API's "
                     f"base URL (like {_base_form(request.url)})?")


def _json(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        raise _not_the_api(resp, f"{resp.status_code} {resp.reason_phrase}, not JSON") from None


def api_error(resp: httpx.Response) -> ApiError | NotTheApi:
    try:
        body = resp.json()
    except ValueError:
        body = {}
    # The API's own 404s (an unknown job or output) carry a code; a 404 without one is a
    # path no route serves, as when --url ends in a path of its own.
    if resp.status_code in (404, 405) and not (isinstance(body, dict) and "code" in body):
        return _not_the_api(resp, f"{resp.status_code} {resp.reason_phrase}")
    detail = body.get("detail") if isinstance(body, dict) else None
    retry = resp.headers.get("Retry-After")
    retry_after = int(retry) if retry and retry.isdigit() else None
    if isinstance(detail, list):
        fields = [(field_name(d.get("loc", [])), str(d.get("msg", "invalid"))) for d in detail]
        lines = "; ".join(f"{f}: {m}" for f, m in fields)
        return ApiError(resp.status_code, f"invalid request: {lines}", fields)
    message = detail if isinstance(detail, str) else f"HTTP {resp.status_code}"
    if retry_after is not None:
        message += f" (retry after {retry_after}s)"
    return ApiError(resp.status_code, message, retry_after=retry_after)


class Client:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 30.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        headers = {"User-Agent": "fibermill-cli"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.base_url = base_url.rstrip("/")
        self.http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout,
                                 transport=transport)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        request = self.http.build_request(method, url, **kwargs)
        try:
            resp = self.http.send(request)
        except httpx.TransportError as exc:
            why = str(exc) or type(exc).__name__
            raise Unreachable(f"cannot reach the API: {method} {request.url} failed ({why}); "
                              f"is it running at {self.base_url}?") from exc
        if resp.is_error:
            raise api_error(resp)
        return resp

    def _call(self, method: str, url: str, **kwargs: Any) -> Any:
        return _json(self._send(method, url, **kwargs))

    def models(self) -> list[dict]:
        return self._call("GET", "/v1/models")["models"]

    def submit(self, body: dict, idempotency_key: str | None = None) -> dict:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._call("POST", "/v1/jobs", json=body, headers=headers)

    def job(self, job_id: str) -> dict:
        return self._call("GET", f"/v1/jobs/{job_id}")

    def jobs(self, limit: int) -> list[dict]:
        return self._call("GET", "/v1/jobs", params={"limit": limit})["jobs"]

    def cancel(self, job_id: str) -> dict:
        return self._call("POST", f"/v1/jobs/{job_id}/cancel")

    def output(self, url: str) -> bytes:
        """An output by the URL the job gives for it (relative, or absolute with a public URL)."""
        return self._send("GET", url).content

    def events(self, job_id: str) -> Iterator[tuple[str, dict]]:
        """The job's event stream; it ends after the job's final status."""
        # The server pings every 15 s, so a minute of silence means the stream is dead.
        timeout = httpx.Timeout(self.http.timeout.connect, read=60.0)
        try:
            with self.http.stream("GET", f"/v1/jobs/{job_id}/events", timeout=timeout,
                                  headers={"Accept": "text/event-stream"}) as resp:
                if resp.is_error:
                    resp.read()
                    raise api_error(resp)
                yield from parse_events(resp.iter_lines())
        except httpx.TransportError as exc:
            raise Unreachable(f"event stream of job {job_id} broke: {exc}") from exc
