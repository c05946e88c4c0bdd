"""Job ids: 32 hex digits laid out as a UUIDv7 (RFC 9562), so an id tells when its job was made.

Retention needs that: a job's outputs are filed under the hour it was made, so the sweeper
deletes whole hours without reading a record, and once a record has expired the API can still
tell an id whose retention ended (410 Gone) from one it never made (404). Ids sort by time, too.
An id of another shape (a test's "job1", a random uuid4) is undated: it works everywhere, its
outputs are filed under the hour they were written.
"""

import os
import re
import time

_DATED = re.compile(r"[0-9a-f]{12}7[0-9a-f]{3}[89ab][0-9a-f]{15}")


def new_job_id(now: float | None = None) -> str:
    ms = int((time.time() if now is None else now) * 1000) & (2**48 - 1)
    rand_a = int.from_bytes(os.urandom(2), "big") & 0x0FFF
    rand_b = int.from_bytes(os.urandom(8), "big") & (2**62 - 1)
    value = (ms << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
    return f"{value:032x}"


def created_at(job_id: str) -> float | None:
    """When a dated id was made (epoch seconds, the making host's clock), else None."""
    if not _DATED.fullmatch(job_id):
        return None
    return int(job_id[:12], 16) / 1000
