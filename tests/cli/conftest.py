"""Run `fibermill` as a real process against the e2e stack (shared per module)."""

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from tests.e2e.conftest import stack  # noqa: F401  (the fixture, reused as it is)

CLI = [sys.executable, "-m", "services.cli"]


@dataclass
class Result:
    code: int
    out: str
    err: str


def run_cli(args: list[str], url: str, timeout: float = 120, **env: str) -> Result:
    environ = {k: v for k, v in os.environ.items() if k != "FIBERMILL_API_KEY"}
    environ.update(FIBERMILL_URL=url, **env)
    proc = subprocess.run([*CLI, *args], env=environ, capture_output=True, text=True,
                          timeout=timeout)
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def cli(stack):  # noqa: F811
    def run(*args: str, timeout: float = 120) -> Result:
        return run_cli(list(args), stack.base_url, timeout)

    return run
