"""Blob keys: what every backend accepts the same way, and the key of a job's output.

A key is `/`-separated segments of safe characters (letters, digits and `-_.=+@~,`), such as
`outputs/2026120209/_/{job_id}/0.png`: never empty, never absolute, no empty, `.` or `..`
segment (so a local key cannot climb out of the store's folder), no segment that starts with
`.` (the local store's unfinished writes are hidden files), at most 1024 bytes (S3's limit).
"""

import re
import time
from datetime import UTC, datetime

from shared.errors import InvalidBlobKey
from shared.job_ids import created_at

MAX_KEY_BYTES = 1024
OUTPUTS = "outputs"
UNOWNED = "_"  # the owner segment of outputs made on an API without keys
_SEGMENT = re.compile(r"[A-Za-z0-9_\-=+@~,][A-Za-z0-9_.\-=+@~,]*")


def check_key(key: str) -> str:
    """The key unchanged, or InvalidBlobKey saying what is wrong with it."""
    if not isinstance(key, str):
        raise InvalidBlobKey(repr(key), "a key is a string")
    if not key:
        raise InvalidBlobKey(key, "empty")
    if key.startswith("/"):
        raise InvalidBlobKey(key, "absolute (starts with /)")
    if key.endswith("/"):
        raise InvalidBlobKey(key, "ends with / (a folder, not an object)")
    _check_segments(key, key.split("/"))
    return key


def check_prefix(prefix: str) -> str:
    """A listing prefix: empty, a folder (`outputs/`) or the start of a key (`outputs/ab`)."""
    if not isinstance(prefix, str):
        raise InvalidBlobKey(repr(prefix), "a prefix is a string")
    if prefix.startswith("/"):
        raise InvalidBlobKey(prefix, "absolute (starts with /)")
    if prefix:
        # A trailing / ends the last folder; a partial last segment may be empty-free only.
        segments = prefix.split("/")
        if segments[-1] == "":
            segments = segments[:-1]
        _check_segments(prefix, segments)
    return prefix


def _check_segments(key: str, segments: list[str]) -> None:
    if len(key.encode()) > MAX_KEY_BYTES:
        raise InvalidBlobKey(key, f"longer than {MAX_KEY_BYTES} bytes")
    for segment in segments:
        if segment in ("", ".", ".."):
            raise InvalidBlobKey(key, f"has an empty, . or .. segment ({segment!r})")
        if not _SEGMENT.fullmatch(segment):
            raise InvalidBlobKey(
                key, f"segment {segment!r} starts with . or has characters outside "
                     "letters, digits and -_.=+@~,")


def output_key(job_id: str, index: int, owner: str | None, suffix: str = "png",
               now: float | None = None) -> str:
    """Where output `index` of a job lives: `outputs/{hour}/{owner}/{job_id}/{index}.png`.

    A function of the job, index and owner alone (for a dated id), so a sub-request that runs
    twice writes the same key: the second write replaces the first with the same bytes, and
    nothing is left behind. The hour (UTC, when the job was made) lets the sweeper delete a
    whole expired hour at once; the owner (the API key's id, `_` on an open API) lets the API
    serve an output to its owner after the job's record has expired, and to no one else. An
    undated id is filed under the hour it is written (`now`)."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise InvalidBlobKey(f"outputs/.../{job_id}/{index}.{suffix}",
                             "index is a whole number >= 0")
    made = created_at(job_id)
    hour = hour_of(made if made is not None else time.time() if now is None else now)
    return check_key(f"{hour_prefix(hour)}{owner or UNOWNED}/{job_id}/{index}.{suffix}")


def hour_of(epoch_seconds: float) -> datetime:
    """The start of the UTC hour an instant falls in."""
    return datetime.fromtimestamp(epoch_seconds, UTC).replace(minute=0, second=0, microsecond=0)


def hour_prefix(hour: datetime, top: str = OUTPUTS) -> str:
    """The prefix of everything under `top` (outputs, or files) made in that UTC hour."""
    return check_prefix(f"{top}/{hour:%Y%m%d%H}/")
