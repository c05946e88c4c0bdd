"""What the code says, read statically where importing would be heavy: the Prometheus metrics
it declares, the ports and modules its processes use."""

from __future__ import annotations

import re
import tomllib
from functools import cache
from pathlib import Path

from shared.settings import REPO_ROOT

CODE_DIRS = ("services", "shared")
_DECLARATION = re.compile(
    r"\b(Counter|Gauge|Histogram|Summary)\(\s*[\"'](fibermill_[A-Za-z0-9_]+)[\"']", re.S
)
_LITERAL = re.compile(r"[\"'](fibermill_[A-Za-z0-9_]+)[\"']")


def _python_files(dirs: tuple[str, ...] = CODE_DIRS) -> list[Path]:
    return sorted(p for d in dirs for p in (REPO_ROOT / d).rglob("*.py"))


@cache
def declared_metrics(dirs: tuple[str, ...] = CODE_DIRS) -> dict[str, str]:
    """Metric base name -> type ("Counter", ...) for every `Counter("fibermill_...")` etc.
    A name that only appears as a string literal (declared through a constant) maps to ""."""
    found: dict[str, str] = {}
    for path in _python_files(dirs):
        text = path.read_text()
        for name in _LITERAL.findall(text):
            found.setdefault(name, "")
        for kind, name in _DECLARATION.findall(text):
            found[name] = kind
    return found


def pyproject() -> dict:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


def extra_pin(extra: str, package: str) -> str | None:
    """The exact version `package==X` is pinned to in an optional-dependencies extra."""
    for requirement in pyproject()["project"]["optional-dependencies"][extra]:
        m = re.fullmatch(rf"\s*{re.escape(package)}\s*==\s*([^;,\s]+)\s*", requirement)
        if m:
            return m.group(1)
    return None


def module_file(module: str) -> Path:
    """The source file of a project module, found without importing it."""
    path = REPO_ROOT / Path(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py", path / "__main__.py"):
        if candidate.is_file():
            return candidate
    raise AssertionError(f"module {module} does not exist in the repository")


def defines_top_level(path: Path, name: str) -> bool:
    return re.search(rf"^{re.escape(name)}\s*(:[^=]*)?=", path.read_text(), re.M) is not None


def is_runnable(path: Path) -> bool:
    """`python -m module` runs something: a __main__ guard, or a package's __main__.py."""
    return path.name == "__main__.py" or 'if __name__ == "__main__"' in path.read_text()


def api_routes() -> set[str]:
    """The paths the API serves (its OpenAPI schema lists every route of its routers)."""
    from services.api.app import app

    return set(app.openapi()["paths"])
