"""Reading Prometheus text exposition in tests: sample values by name and labels, and
`promtool check metrics`."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable

import pytest
from prometheus_client.parser import text_string_to_metric_families

PROMTOOL_MISSING = (
    "promtool is missing: it comes with Debian's `prometheus` package "
    "(`apt-get install prometheus`, which `make system-deps` / `make test` run as root)"
)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of a /metrics page: (series name, labels) -> value."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def families(text: str) -> dict[str, str]:
    """Family name (as the parser reports it, without _total) -> type."""
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def total(samples: Samples | Iterable[Samples], name: str, **labels: str) -> float:
    """The sum of the samples named `name` whose labels include `labels` (over several pages
    when given a list: one per process)."""
    pages = [samples] if isinstance(samples, dict) else list(samples)
    want = set(labels.items())
    return sum(v for page in pages for (n, ls), v in page.items() if n == name and want <= ls)


def label_values(samples: Samples, name: str, label: str) -> set[str]:
    return {dict(ls)[label] for (n, ls) in samples if n == name and label in dict(ls)}


def promtool_check(text: str) -> None:
    """`promtool check metrics` on a page: fails the test on any lint problem, and fails (not
    skips) it when promtool is not installed."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail(PROMTOOL_MISSING)
    proc = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                          capture_output=True, timeout=60)
    report = (proc.stdout + proc.stderr).decode()
    assert proc.returncode == 0, f"promtool check metrics:\n{report}"
