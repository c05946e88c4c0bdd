"""The Grafana dashboard: valid JSON, one datasource variable used everywhere, and every
metric it queries declared by the code with the type its query assumes. (That each metric
appears on a live /metrics page is the end-to-end test's job: it imports
dashboard_metric_names.)"""

import json

import pytest

from tests.deploy import facts
from tests.deploy.dashboard import (
    DASHBOARD,
    base_name,
    dashboard_metric_names,
    dashboard_series_names,
    expressions,
    series_names,
)

# What the dashboard must show (the Observability section of DESIGN.md, and the engine's own).
REQUIRED = {
    "fibermill_jobs_finished",
    "fibermill_queue_depth",
    "fibermill_subrequests_backlog",
    "fibermill_job_duration_seconds",
    "fibermill_job_queue_seconds",
    "fibermill_job_run_seconds",
    "fibermill_phase_duration_seconds",
    "fibermill_batch_size",
    "fibermill_buffer_leases",
    "fibermill_buffer_free_sets",
    "fibermill_buffer_adhoc_live",
    "fibermill_device_memory_allocated_bytes",
    "fibermill_device_memory_reserved_bytes",
    "fibermill_webhook_deliveries",
    "fibermill_http_requests",
    "fibermill_worker_subrequests",
    "fibermill_device_syncs",
}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard):
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels") or []


def test_dashboard_has_a_datasource_variable(dashboard):
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"] == DATASOURCE


def test_every_panel_queries_the_datasource_variable(dashboard):
    graphs = [p for p in panels(dashboard) if p["type"] != "row"]
    assert len(graphs) >= 15
    for panel in graphs:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource", DATASOURCE) == DATASOURCE, panel["title"]
            assert series_names(target["expr"]), f"{panel['title']}: no Fibermill metric"


def test_panels_have_unique_ids_and_fit_the_grid(dashboard):
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    for panel in panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        refs = [t["refId"] for t in panel.get("targets") or []]
        assert len(refs) == len(set(refs)), panel["title"]
    assert dashboard["uid"] and dashboard["title"]


def test_expressions_are_balanced(dashboard):
    for expr in expressions(dashboard):
        for open_, close in ("()", "{}", "[]"):
            depth = 0
            for ch in expr:
                depth += (ch == open_) - (ch == close)
                assert depth >= 0, expr
            assert depth == 0, expr
        assert expr.count('"') % 2 == 0, expr


def test_quantiles_keep_le(dashboard):
    for expr in expressions(dashboard):
        if "histogram_quantile" in expr:
            assert "by (le" in expr and "_bucket{" in expr, expr


def test_dashboard_shows_what_operators_need():
    assert dashboard_metric_names() >= REQUIRED


def test_every_metric_is_declared_with_the_type_its_query_assumes():
    """A `_bucket`/`_sum`/`_count` series belongs to a Histogram, `_total` to a Counter, a bare
    name to a Gauge. Names only declared through a constant are checked for existence."""
    declared = facts.declared_metrics()
    missing = sorted(dashboard_metric_names() - set(declared))
    assert missing == [], f"metrics the dashboard queries that no code declares: {missing}"
    for series in dashboard_series_names():
        kind = declared[base_name(series)]
        if not kind:
            continue
        if series.endswith(("_bucket", "_sum", "_count")):
            assert kind in ("Histogram", "Summary"), (series, kind)
        elif series.endswith("_total"):
            assert kind == "Counter", (series, kind)
        else:
            assert kind == "Gauge", (series, kind)


def test_metric_name_extraction():
    expr = (
        'sum by (le) (rate(fibermill_job_run_seconds_bucket{model=~"$model"}[5m])) '
        "/ sum(rate(fibermill_jobs_finished_total[5m])) + fibermill_queue_depth"
    )
    assert series_names(expr) == {
        "fibermill_job_run_seconds_bucket",
        "fibermill_jobs_finished_total",
        "fibermill_queue_depth",
    }
    assert {base_name(s) for s in series_names(expr)} == {
        "fibermill_job_run_seconds",
        "fibermill_jobs_finished",
        "fibermill_queue_depth",
    }


def test_dashboard_metric_names_reads_a_given_file(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(
        json.dumps(
            {
                "panels": [
                    {"type": "row", "panels": [{"targets": [{"expr": "fibermill_a_count"}]}]},
                    {"targets": [{"expr": "rate(fibermill_b_total[1m])"}]},
                ],
                "templating": {
                    "list": [{"type": "query", "query": {"query": "label_values(fibermill_c, m)"}}]
                },
            }
        )
    )
    assert dashboard_metric_names(path) == {"fibermill_a", "fibermill_b", "fibermill_c"}
