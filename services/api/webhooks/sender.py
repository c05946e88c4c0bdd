"""One HTTP attempt at one webhook: signed JSON POST, no redirects, bounded time, and the
connection pinned to an address the SSRF guard has just checked.

Pinning: the HTTP client's network backend (GuardedBackend) is the only place that turns the
hostname into an address. It resolves the name when the connection is opened, refuses it if
any address is blocked, and connects to a checked address. The URL, the Host header and TLS
(SNI and certificate verification) keep the hostname, because httpcore passes the hostname,
not the address, to the TLS handshake. Nothing resolves the name a second time between the
check and the connect, so DNS rebinding has no window. Pooled connections are keyed by the
hostname and only ever lead to an address that was checked when they were opened.
"""

import asyncio
import json
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import httpcore
import httpx

from services.api.webhooks.retry import parse_retry_after
from services.api.webhooks.signing import Signer
from services.api.webhooks.ssrf import UnresolvableHost, check_url_syntax, resolve_allowed
from shared.errors import InvalidInput

USER_AGENT = "fibermill-webhooks/1"


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore network backend that connects only to addresses the SSRF guard allows."""

    def __init__(self, allow_private: bool) -> None:
        self._inner = httpcore.AnyIOBackend()
        self.allow_private = allow_private

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addrs = await resolve_allowed(host, port, self.allow_private)
        error: Exception | None = None
        for ip in addrs:
            try:
                return await self._inner.connect_tcp(
                    str(ip), port, timeout=timeout, local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
        assert error is not None  # resolve_allowed never returns an empty list
        raise error

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("webhooks are never sent to unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class PinnedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport with its connection pool built on GuardedBackend."""

    def __init__(self, allow_private: bool, verify: ssl.SSLContext | bool = True,
                 limits: httpx.Limits | None = None) -> None:
        limits = limits or httpx.Limits(max_connections=200, max_keepalive_connections=20)
        super().__init__(verify=verify, trust_env=False, limits=limits)
        # httpx takes no network backend, so the pool it built is replaced by an equal one
        # that has ours; nothing was opened on the discarded pool.
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify, trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=GuardedBackend(allow_private),
        )


@dataclass
class Attempt:
    """How one attempt went. `verdict`: delivered (2xx), retry (worth trying again) or final
    (the receiver or the guard refused it for good)."""

    verdict: Literal["delivered", "retry", "final"]
    status_code: int | None = None
    error: str | None = None
    retry_after: float | None = None


def judge(status: int, retry_after: float | None) -> Attempt:
    if 200 <= status < 300:
        return Attempt("delivered", status)
    if 300 <= status < 400:
        return Attempt("retry", status, "redirect not followed")
    if status == 429 or status >= 500:
        return Attempt("retry", status, f"HTTP {status}", retry_after)
    return Attempt("final", status, f"HTTP {status}")


class Sender:
    def __init__(self, timeout: float, allow_private: bool,
                 verify: ssl.SSLContext | bool = True) -> None:
        self.timeout = timeout
        self.client = httpx.AsyncClient(
            transport=PinnedTransport(allow_private, verify),
            timeout=httpx.Timeout(timeout),
            follow_redirects=False,
            trust_env=False,  # an environment proxy would connect to the unchecked name
            headers={"user-agent": USER_AGENT},
        )

    async def post(self, url: str, webhook_id: str, payload: dict[str, Any],
                   signer: Signer) -> Attempt:
        """One attempt, signed by `signer` (the secrets of the webhook's owner)."""
        body = json.dumps(payload, separators=(",", ":"))
        headers = {"content-type": "application/json", **signer.headers(webhook_id, body)}
        try:
            check_url_syntax(url)
            # httpx's timeout is per phase; this bounds the whole attempt, resolution included,
            # which the outbox's claim lease relies on.
            async with asyncio.timeout(self.timeout):
                # Streamed so the receiver's answer body is never read: only its status counts.
                async with self.client.stream(
                    "POST", url, content=body.encode(), headers=headers
                ) as resp:
                    after = parse_retry_after(resp.headers.get("retry-after"))
                    return judge(resp.status_code, after)
        except UnresolvableHost as exc:
            return Attempt("retry", error=exc.message)
        except InvalidInput as exc:
            return Attempt("final", error=exc.message)
        except httpx.InvalidURL as exc:
            return Attempt("final", error=f"invalid URL: {exc}")
        except TimeoutError:
            return Attempt("retry", error=f"timed out after {self.timeout:g}s")
        except httpx.HTTPError as exc:
            return Attempt("retry", error=f"{type(exc).__name__}: {exc}"[:500])

    async def aclose(self) -> None:
        await self.client.aclose()
