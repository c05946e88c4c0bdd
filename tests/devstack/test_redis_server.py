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
    # The first two picks would cover `port`; later ones are random, since any fixed port
    # (port + 1 say) may be in use by something else on the machine at that moment.
    real = rs.random.Random.randrange
    picks = [port - 1, port - 1]
    calls = []

    def randrange(self, a, b):
        calls.append((a, b))
        return picks.pop(0) if picks else real(self, a, b)

    monkeypatch.setattr(rs, "PORTS_FROM", 1024)
    monkeypatch.setattr(rs.random.Random, "randrange", randrange)
    try:
        base = rs.free_ports(2)
        assert len(calls) >= 3  # both runs that cover `port` were turned down
        assert port not in (base, base + 1)
    finally:
        taken.close()
