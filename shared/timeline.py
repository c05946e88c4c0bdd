"""A job's timeline: when each of its sub-requests was queued, leased, started and finished, how
many attempts it took and which worker ran it.

Read from the job's record alone, in the HGETALL a job read makes anyway: the scripts write
these timestamps in writes they already make (the lease's HSET in acquire_lease.lua, the
result's in store_result.lua), so a timeline costs no command of its own on the way and none
on reading. The lease time is the Redis server's clock; started and finished are the worker's.
"""

from datetime import UTC, datetime

from shared import names
from shared.job import SubRequestTiming


def _dt(raw: bytes | str | None) -> datetime | None:
    if not raw:
        return None
    return datetime.fromtimestamp(float(raw), UTC)


def ran_value(started: float | None, finished: float | None, worker: str) -> str:
    """The `ran` field's value: 'started finished worker' ('-' for a time not known)."""
    return f"{'-' if started is None else repr(started)} " \
           f"{'-' if finished is None else repr(finished)} {worker}"


def timeline_in(raw: dict[bytes, bytes], total: int, created_at: float) -> list[SubRequestTiming]:
    """Each sub-request's timing, from a job's record as HGETALL reads it."""
    queued = datetime.fromtimestamp(created_at, UTC)
    out = []
    for i in range(total):
        started = finished = None
        worker = raw.get(names.owner_field(i).encode(), b"").decode() or None
        ran = raw.get(names.ran_field(i).encode())
        if ran:
            s, f, who = ran.decode().split(" ", 2)
            started, finished = _dt(s if s != "-" else None), _dt(f if f != "-" else None)
            worker = who or worker
        out.append(SubRequestTiming(
            index=i, queued_at=queued, leased_at=_dt(raw.get(names.leased_field(i).encode())),
            started_at=started, finished_at=finished,
            attempts=int(raw.get(names.attempts_field(i).encode(), b"0")), worker=worker))
    return out
