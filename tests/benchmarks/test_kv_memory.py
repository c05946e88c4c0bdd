"""The KV-memory benchmark's report (no benchmark runs here)."""

from benchmarks import kv_memory as km


def test_rows_at_once_are_set_against_budget_over_length():
    s = km.Sitting(128, rows_at_once=[7, 8, 8, 9], occupancy=[0.9, 0.92], preemptions=3,
                   tokens=[113] * 48)
    assert s.ideal == 8.0
    row = [line for line in km.report([s]) if line.startswith("| 128 |")]
    assert row == ["| 128 | 8 | 8.0 | 1.00 | 0.910 | 3 | 113 |"]
