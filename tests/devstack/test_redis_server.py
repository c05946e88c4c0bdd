"""Free ports for the test and bench stacks: consecutive, free, and outside the range the
kernel hands outgoing connections (which could take one between the check and the bind)."""

import socket

from services.devstack.redis_server import PORTS_FROM, PORTS_TO, free_ports


def _ephemeral_start() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        return int(f.read().split()[0])


def test_free_ports_are_consecutive_bindable_and_below_the_ephemeral_range():
    base = free_ports(3)
    assert base >= PORTS_FROM and base + 3 <= PORTS_TO <= _ephemeral_start()
    socks = [socket.socket() for _ in range(3)]
    try:
        for i, s in enumerate(socks):
            s.bind(("127.0.0.1", base + i))
    finally:
        for s in socks:
            s.close()


def test_a_taken_port_is_never_handed_out(monkeypatch):
    import services.devstack.redis_server as rs

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    picks = iter([port - 1, port - 1, port + 1])  # the first two runs would cover `port`
    monkeypatch.setattr(rs, "PORTS_FROM", 1024)
    monkeypatch.setattr(rs.random.Random, "randrange", lambda self, a, b: next(picks))
    try:
        assert rs.free_ports(2) == port + 1
    finally:
        taken.close()
