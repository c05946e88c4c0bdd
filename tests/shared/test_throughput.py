"""A model's throughput from its finished counts: none without work, and the time counted
from the first bucket that saw work."""

from shared.throughput import BUCKET_SECONDS, buckets_in, measure


def test_nothing_finished_is_no_measure():
    assert measure(1000.0, [0] * 12) is None


def test_the_time_counted_starts_at_the_oldest_bucket_with_work():
    now = 1002.0  # bucket 200 starts at 1000.0
    got = measure(now, [2, 0, 4, 0, 0, 0])  # work in buckets 200 and 198 (from 990.0)
    assert got is not None
    assert (got.finished, got.seconds) == (6, 12.0)
    assert got.per_second == 0.5


def test_the_first_results_count_over_a_bucket_at_least():
    got = measure(1000.5, [3, 0, 0])
    assert got is not None and got.seconds == BUCKET_SECONDS and got.per_second == 0.6


def test_a_window_is_read_in_whole_buckets():
    assert buckets_in(120) == 24 and buckets_in(12) == 3
