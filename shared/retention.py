"""How long things are kept, as rules both the sweeper and the API apply.

A finished job's record stays in Redis for `finished_job_ttl_seconds` after it finished (its
keys' TTL, set by finalize.lua). Outputs stay in the blob store, filed by the UTC hour their job was
made, until `output_ttl_seconds` after that hour ends: at least the TTL after the job was made,
at most an hour more. Ids say when their job was made (shared/job_ids.py), so either rule can be
applied to an id whose record is gone.
"""

from datetime import datetime, timedelta

from shared.blobstore.keys import hour_of
from shared.errors import JobExpired, JobNotFound
from shared.job_ids import created_at

HOUR = timedelta(hours=1)


def hour_expired(hour: datetime, output_ttl_seconds: int, now: float) -> bool:
    """Whether the outputs of jobs made in this hour are past their retention."""
    return (hour + HOUR).timestamp() + output_ttl_seconds <= now


def outputs_expired(job_id: str, output_ttl_seconds: int, now: float) -> bool:
    made = created_at(job_id)
    return made is not None and hour_expired(hour_of(made), output_ttl_seconds, now)


def record_expired(job_id: str, finished_ttl_seconds: int, now: float) -> bool:
    """Whether a job whose record is not found had it expire: made longer ago than the
    record's TTL (it finished at least that long ago, or it would still be there). An undated
    id, or one made more recently, was never made here."""
    made = created_at(job_id)
    return made is not None and made + finished_ttl_seconds <= now


def missing_job(job_id: str, finished_ttl_seconds: int, now: float) -> JobNotFound:
    """The error for a job whose record is not found: expired (410) or never made (404)."""
    if record_expired(job_id, finished_ttl_seconds, now):
        return JobExpired(job_id, finished_ttl_seconds)
    return JobNotFound(job_id)
