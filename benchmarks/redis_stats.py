"""What Redis counts: commands by name (INFO commandstats), connections, and a MONITOR sample
that tells the commands clients sent from those run inside scripts."""

import re
import threading
import time
from collections import Counter
from contextlib import suppress

import redis


def commandstats(r: redis.Redis) -> dict[str, tuple[int, int]]:
    """command -> (calls, usec), without INFO itself (the measurement's own)."""
    out = {}
    for key, v in r.info("commandstats").items():
        name = key.removeprefix("cmdstat_")
        if name in ("info", "monitor"):
            continue
        out[name] = (int(v["calls"]), int(v["usec"]))
    return out


def delta(after: dict, before: dict) -> dict[str, tuple[int, int]]:
    out = {}
    for name, (calls, usec) in after.items():
        c0, u0 = before.get(name, (0, 0))
        if calls - c0:
            out[name] = (calls - c0, usec - u0)
    return out


def connections_received(r: redis.Redis) -> int:
    return int(r.info("stats")["total_connections_received"])


class Monitor:
    """MONITOR in a thread: top-level commands vs commands run inside scripts."""

    LINE = re.compile(r'^[\d.]+ \[\d+ ([^\]]+)\] "([^"]+)"')

    def __init__(self, port: int) -> None:
        self.port = port
        self.top: Counter[str] = Counter()
        self.lua: Counter[str] = Counter()
        self._stop = threading.Event()
        self._conn = redis.Redis(port=port, socket_timeout=0.5)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Monitor":
        self._mon = self._conn.monitor().__enter__()
        self._thread.start()
        time.sleep(0.2)
        return self

    def _run(self) -> None:
        conn = self._mon.connection
        while not self._stop.is_set():
            try:
                raw = conn.read_response()
            except (redis.TimeoutError, TimeoutError):
                continue
            except Exception:
                return
            line = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
            m = self.LINE.match(line)
            if not m:
                continue
            who, cmd = m.group(1), m.group(2).lower()
            if cmd in ("info", "monitor"):
                continue
            (self.lua if who == "lua" else self.top)[cmd] += 1

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(2)
        with suppress(Exception):
            self._conn.close()
