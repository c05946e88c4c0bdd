"""SSRF guard for webhook URLs: only public http(s) addresses, checked when a job is submitted
and again, on the address actually connected to, when each webhook is sent (sender.py)."""

import asyncio
import ipaddress
import socket
from urllib.parse import SplitResult, urlsplit

from shared.errors import InvalidInput

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# A resolver that hangs must not hold a submission (or a sender slot) for long.
RESOLVE_TIMEOUT_SECONDS = 5.0


class UnresolvableHost(InvalidInput):
    """The hostname has no address (now): refused at submission, retried at send time."""


class BlockedAddress(InvalidInput):
    """The hostname resolves to an address webhooks may not reach."""


def check_url_syntax(url: str) -> SplitResult:
    """Refuse anything but a plain http(s) URL with a host and without credentials."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number or too big
    except ValueError as exc:
        raise InvalidInput("webhook", f"not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise InvalidInput("webhook", "only http and https URLs are allowed")
    if parts.username is not None or parts.password is not None:
        raise InvalidInput("webhook", "URLs with credentials are not allowed")
    if not parts.hostname:
        raise InvalidInput("webhook", "the URL has no host")
    return parts


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one routes to, for the forms a kernel or gateway translates."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    return None


def blocked_reason(ip: IPAddress) -> str | None:
    """Why a webhook may not be sent to this address, or None when it may."""
    if isinstance(ip, ipaddress.IPv6Address):
        v4 = _embedded_ipv4(ip)
        if v4 is not None:
            reason = blocked_reason(v4)
            return f"{reason} (embedded in {ip})" if reason else None
    checks = (
        ("is_loopback", "loopback"),
        ("is_link_local", "link-local"),
        ("is_unspecified", "unspecified"),
        ("is_multicast", "multicast"),
        ("is_private", "private"),
        ("is_reserved", "reserved"),
    )
    for attr, what in checks:
        if getattr(ip, attr):
            return f"{ip} is a {what} address"
    if not ip.is_global:  # e.g. 100.64.0.0/10, shared carrier-grade NAT space
        return f"{ip} is not a public address"
    return None


async def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address the host resolves to, through the event loop's resolver (no traffic to
    the host itself)."""
    try:
        async with asyncio.timeout(RESOLVE_TIMEOUT_SECONDS):
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM
            )
    except TimeoutError:
        raise UnresolvableHost("webhook", f"cannot resolve {host!r}: timed out") from None
    except (OSError, UnicodeError) as exc:  # socket.gaierror is an OSError
        raise UnresolvableHost("webhook", f"cannot resolve {host!r}: {exc}") from None
    addrs: list[IPAddress] = []
    for _family, _type, _proto, _canon, sockaddr in infos:
        # IPv6 sockaddrs may carry a zone ("fe80::1%eth0"); the zone is not part of the address.
        ip = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if ip not in addrs:
            addrs.append(ip)
    if not addrs:
        raise UnresolvableHost("webhook", f"cannot resolve {host!r}: no addresses")
    return addrs


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


async def resolve_allowed(host: str, port: int, allow_private: bool) -> list[IPAddress]:
    """Resolve and refuse the host if ANY of its addresses is blocked: an attacker who controls
    the DNS could otherwise mix one private address among public ones."""
    addrs = await resolve(host, port)
    if not allow_private:
        for ip in addrs:
            reason = blocked_reason(ip)
            if reason:
                where = "" if _literal(host) == ip else f"{host} resolves to a blocked address: "
                raise BlockedAddress("webhook", where + reason)
    return addrs


def default_port(parts: SplitResult) -> int:
    return parts.port or (443 if parts.scheme == "https" else 80)


async def check_webhook_url(url: str, allow_private: bool) -> None:
    """Raise InvalidInput("webhook", why) unless `url` may receive webhooks."""
    parts = check_url_syntax(url)
    assert parts.hostname is not None  # checked above
    await resolve_allowed(parts.hostname, default_port(parts), allow_private)
