"""Blob keys: what every backend accepts the same way, and the key of a job's output.

A key is `/`-separated segments of safe characters (letters, digits and `-_.=+@~,`), such as
`outputs/{job_id}/{index}.png`: never empty, never absolute, no empty, `.` or `..` segment (so
a local key cannot climb out of the store's folder), no segment that starts with `.` (the local
store's unfinished writes are hidden files), at most 1024 bytes (S3's limit).
"""

import re

from shared.errors import InvalidBlobKey

MAX_KEY_BYTES = 1024
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


def output_key(job_id: str, index: int, suffix: str = "png") -> str:
    """Where output `index` of a job lives. A function of (job, index) alone, so a sub-request
    that runs twice writes the same key: the second write replaces the first with the same
    bytes, and nothing is left behind."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise InvalidBlobKey(f"outputs/{job_id}/{index}.{suffix}", "index is a whole number >= 0")
    return check_key(f"outputs/{job_id}/{index}.{suffix}")


def job_prefix(job_id: str) -> str:
    """The prefix of every output of a job (to list or delete them together)."""
    return check_prefix(f"outputs/{job_id}/")
