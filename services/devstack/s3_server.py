"""A local S3 endpoint for tests and benchmarks: `python -m moto.server` on 127.0.0.1, state in
memory, in a process of its own (which a test may kill, or freeze with SIGSTOP)."""

import signal
import socket
import subprocess
import sys
import time

from services.devstack.redis_server import free_port


class S3Server:
    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto.server exited with {self.proc.returncode}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"moto.server did not listen on {self.url} in {timeout}s")
            time.sleep(0.05)

    def _answers(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
        except OSError:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL: the server vanishes without closing anything itself."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
