from datetime import UTC, datetime

from shared.job_ids import new_job_id
from shared.retention import hour_expired, outputs_expired, record_expired

HOUR = datetime(2026, 12, 2, 9, tzinfo=UTC)
WEEK = 7 * 86400


def test_an_hour_of_outputs_expires_a_ttl_after_the_hour_ends():
    end = HOUR.timestamp() + 3600
    assert not hour_expired(HOUR, WEEK, end + WEEK - 1)
    assert hour_expired(HOUR, WEEK, end + WEEK)


def test_every_output_is_kept_at_least_its_ttl_and_at_most_an_hour_more():
    for minute in (0, 30, 59):
        made = HOUR.timestamp() + minute * 60 + 59
        job_id = new_job_id(made)
        assert not outputs_expired(job_id, WEEK, made + WEEK - 1)
        assert outputs_expired(job_id, WEEK, made + WEEK + 3600)
    assert not outputs_expired("job1", WEEK, HOUR.timestamp() + 10 * WEEK)  # undated


def test_a_missing_record_expired_only_if_its_job_was_made_a_ttl_ago():
    made = HOUR.timestamp()
    assert not record_expired(new_job_id(made), 86400, made + 86399)
    assert record_expired(new_job_id(made), 86400, made + 86400)
    assert not record_expired("0123" * 8, 86400, made + WEEK)  # undated
