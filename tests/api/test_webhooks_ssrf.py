"""The SSRF guard on webhook URLs at submission: validation resolves names and sends nothing."""

import ipaddress
import socket
from typing import Any

import pytest

from services.api.webhooks.ssrf import blocked_reason, check_webhook_url
from shared.errors import InvalidInput

PRIVATE = [
    "http://127.0.0.1/",
    "http://10.0.0.1/",
    "http://169.254.169.254/latest/meta-data/",
    "http://[::1]/",
    "http://localhost:8080/hook",
    "http://172.16.5.4/",
    "http://192.168.1.1/",
    "http://0.0.0.0/",
    "http://[::]/",
    "http://100.64.0.1/",
    "http://[fe80::1]/",
    "http://[fc00::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:10.0.0.1]/",
    "http://[64:ff9b::a9fe:a9fe]/",  # NAT64 of 169.254.169.254
    "http://[2002:7f00:1::1]/",  # 6to4 of 127.0.0.1
]
ALWAYS_REFUSED = [
    "ftp://example.com/",
    "file:///etc/passwd",
    "http://user:pw@example.com/",
    "http://user@example.com/",
    "https:///no-host",
    "http://example.com:99999/",
]


@pytest.fixture(autouse=True)
def no_traffic(monkeypatch) -> None:
    """Any connection attempt fails the test: validation may only resolve."""

    def refuse(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("the SSRF guard opened a connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


@pytest.fixture
def dns(monkeypatch) -> dict[str, list[str]]:
    """A resolver for names the test sets; any other name does not resolve."""
    table: dict[str, list[str]] = {}

    def getaddrinfo(host: Any, port: Any, *_args: Any, **_kwargs: Any) -> list:
        name = host.decode() if isinstance(host, bytes) else host
        if name not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, port)) for a in table[name]]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return table


@pytest.mark.parametrize("url", PRIVATE)
async def test_private_targets_are_refused(url):
    with pytest.raises(InvalidInput) as exc:
        await check_webhook_url(url, allow_private=False)
    assert exc.value.field == "webhook"


@pytest.mark.parametrize("url", PRIVATE)
async def test_private_targets_are_allowed_when_configured(url):
    await check_webhook_url(url, allow_private=True)


@pytest.mark.parametrize("url", ALWAYS_REFUSED)
@pytest.mark.parametrize("allow_private", [False, True])
async def test_malformed_urls_are_refused(url, allow_private):
    with pytest.raises(InvalidInput):
        await check_webhook_url(url, allow_private=allow_private)


async def test_the_reason_is_given():
    with pytest.raises(InvalidInput, match="credentials"):
        await check_webhook_url("http://user:pw@example.com/", allow_private=False)
    with pytest.raises(InvalidInput, match="http and https"):
        await check_webhook_url("ftp://example.com/", allow_private=False)
    with pytest.raises(InvalidInput, match="link-local"):
        await check_webhook_url("http://169.254.169.254/", allow_private=False)


async def test_a_public_name_passes(dns):
    dns["hooks.example.com"] = ["93.184.216.34"]
    await check_webhook_url("https://hooks.example.com/fibermill", allow_private=False)


async def test_a_name_with_any_private_address_is_refused(dns):
    dns["mixed.example.com"] = ["93.184.216.34", "10.1.2.3"]
    with pytest.raises(InvalidInput, match=r"10\.1\.2\.3 is a private address"):
        await check_webhook_url("https://mixed.example.com/", allow_private=False)
    dns["mapped.example.com"] = ["::ffff:169.254.169.254"]
    with pytest.raises(InvalidInput, match="link-local"):
        await check_webhook_url("https://mapped.example.com/", allow_private=False)


@pytest.mark.parametrize("allow_private", [False, True])
async def test_a_name_that_does_not_resolve_is_refused(dns, allow_private):
    with pytest.raises(InvalidInput, match="cannot resolve"):
        await check_webhook_url("https://nowhere.example.com/", allow_private=allow_private)


@pytest.mark.parametrize("addr", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111"])
def test_public_addresses_are_not_blocked(addr):
    assert blocked_reason(ipaddress.ip_address(addr)) is None


@pytest.mark.parametrize("addr", ["224.0.0.1", "ff02::1", "240.0.0.1", "255.255.255.255",
                                  "198.18.0.1", "::ffff:192.168.0.1"])
def test_other_special_addresses_are_blocked(addr):
    assert blocked_reason(ipaddress.ip_address(addr)) is not None
