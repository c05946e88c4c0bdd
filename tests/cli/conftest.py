"""Run `fibermill` as a real process: against the e2e stack (shared per module), or against a
scripted fake API; on pipes, or on a pseudo-terminal."""

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from tests.cli.fakeapi import FakeApi
from tests.e2e.conftest import stack  # noqa: F401  (the fixture, reused as it is)

CLI = [sys.executable, "-m", "services.cli"]


@dataclass
class Result:
    code: int
    out: str
    err: str


def cli_env(url: str, **env: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("FIBERMILL_API_KEY", "NO_COLOR", "FORCE_COLOR")}
    environ.update(FIBERMILL_URL=url, **env)
    return environ


def run_cli(args: list[str], url: str, timeout: float = 120, **env: str) -> Result:
    environ = cli_env(url, **env)
    proc = subprocess.run([*CLI, *args], env=environ, capture_output=True, text=True,
                          timeout=timeout)
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def cli(stack):  # noqa: F811
    def run(*args: str, timeout: float = 120) -> Result:
        return run_cli(list(args), stack.base_url, timeout)

    return run


def run_in_pty(args: list[str], url: str, when: str | None = None,
               then: Callable[[], None] = lambda: None, timeout: float = 60) -> tuple[int, str]:
    """Run the CLI with stdin, stdout and stderr on one pseudo-terminal of 120 columns, and
    return its exit code and all it wrote there; `then` runs once `when` has been written."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen([*CLI, *args], stdin=follower, stdout=follower, stderr=follower,
                            env=cli_env(url, TERM="xterm-256color"))
    os.close(follower)
    chunks: list[bytes] = []
    try:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
            if when is not None and when in b"".join(chunks).decode(errors="replace"):
                when = None
                then()
    finally:
        os.close(leader)
        code = proc.wait(timeout=timeout)
    return code, b"".join(chunks).decode(errors="replace")


@pytest.fixture
def fake_api():
    api = FakeApi()
    yield api
    api.close()
