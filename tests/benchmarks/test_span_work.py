"""The micro-measure of a trace's CPU runs the handler's own span code and leaves tracing off
in the process it ran in."""

from benchmarks.span_work import report, run
from shared import tracing


def test_it_measures_each_part_and_leaves_tracing_off():
    r = run(batches=1, jobs=20, requests=20)
    assert set(r) == {"worker", "submit", "server_none", "server_fibermill",
                      "server_instrumentation"}
    assert all(v > 0 for v in r.values()), r
    assert not tracing.enabled() and tracing.start("fibermill.lease", "00-" + "1" * 32
                                                   + "-" + "1" * 16 + "-01") is None
    (line,) = report(r)
    assert f"**{r['worker']:.0f} us**" in line and "FastAPI's OpenTelemetry" in line
