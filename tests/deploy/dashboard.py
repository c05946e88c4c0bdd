"""Read the metric names out of a Grafana dashboard's PromQL.

`dashboard_metric_names(path)` is also imported by the end-to-end test that checks each name
against a live /metrics page.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

from shared.settings import REPO_ROOT

DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "fibermill.json"

# A Fibermill series name in a PromQL expression. Label names never start with the prefix,
# and label values are quoted (a quoted "fibermill_..." would still be read as a name: none is).
_SERIES = re.compile(r"(?<![A-Za-z0-9_:])fibermill_[A-Za-z0-9_:]*")
# What Prometheus appends to a family's name: histograms' and summaries' series, counters'.
SERIES_SUFFIXES = ("_bucket", "_sum", "_count", "_total")


def expressions(dashboard: dict) -> Iterator[str]:
    """Every PromQL expression: panel targets (rows' nested panels too) and template queries."""

    def panels(items: list) -> Iterator[dict]:
        for panel in items or []:
            yield panel
            yield from panels(panel.get("panels") or [])

    for panel in panels(dashboard.get("panels") or []):
        for target in panel.get("targets") or []:
            if target.get("expr"):
                yield target["expr"]
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if query:
            yield query


def series_names(expr: str) -> set[str]:
    """The series names an expression selects, as written (`fibermill_x_bucket`)."""
    return set(_SERIES.findall(expr))


def base_name(series: str) -> str:
    """The metric family a series belongs to: `fibermill_x_bucket` -> `fibermill_x`."""
    for suffix in SERIES_SUFFIXES:
        if series.endswith(suffix):
            return series[: -len(suffix)]
    return series


def dashboard_series_names(path: Path | str = DASHBOARD) -> set[str]:
    dashboard = json.loads(Path(path).read_text())
    return {name for expr in expressions(dashboard) for name in series_names(expr)}


def dashboard_metric_names(path: Path | str = DASHBOARD) -> set[str]:
    """The base names of every Fibermill metric the dashboard queries, without the
    `_bucket`/`_sum`/`_count`/`_total` series suffixes: what prometheus_client names a family
    (its `Counter("fibermill_jobs_finished", ...)` is exposed as fibermill_jobs_finished_total)
    and what `prometheus_client.parser.text_string_to_metric_families` reports as
    `family.name`."""
    return {base_name(name) for name in dashboard_series_names(path)}
