"""A batch input file checked a chunk at a time (jsonl.py has the rules of a line): only the
line being read is held, never the file, so an upload (from its spooled temporary file) and a
batch's validation (streamed from the blob store) cost a line and the index, not the file.

The index is where each request is, packed: (line number, start, end) as three little-endian
unsigned 64-bit integers, request i at bytes [24 i, 24 i + 24). A batch keeps it in the blob
store beside its copy of the input, and its driver reads the entries of the lines it is about
to run (batch_input.py). Checking is CPU work: run `feed` and `check_file` off the event loop
(in a thread)."""

import sys
from array import array
from dataclasses import dataclass
from typing import BinaryIO

from services.api.batches import jsonl
from shared.errors import InvalidInput, PayloadTooLarge, Problem

ENTRY_BYTES = 24
READ_BYTES = 256 * 1024  # what check_file reads at once


class Checker:
    """Feed it the file's bytes in order (`feed`), then `close()` for the number of requests
    (InvalidInput listing the problems, each with its line number, when it is not a batch
    input); `index()` then gives the packed index. A line longer than `max_line_bytes` is a
    problem, and is skipped without being held."""

    def __init__(self, max_line_bytes: int) -> None:
        self.max_line_bytes = max_line_bytes
        self.problems: list[str] = []
        self.requests = 0
        self.size = 0
        self._first_seen: dict[int, int] = {}
        self._entries = array("Q")
        self._number = 1  # of the line being read
        self._start = 0  # its offset
        self._partial = bytearray()  # what was read of it, when it began in an earlier chunk
        self._too_long = False  # it is longer than max_line_bytes: skipped to its end

    def feed(self, chunk: bytes) -> None:
        pos = 0
        while (nl := chunk.find(b"\n", pos)) >= 0:
            if self._partial or self._too_long:
                self._append(chunk[pos:nl])
                raw = bytes(self._partial)
                self._partial.clear()
            else:
                raw = chunk[pos:nl]
                self._too_long = len(raw) > self.max_line_bytes
            self._line(raw, self.size + nl)
            pos = nl + 1
        self._append(chunk[pos:])
        self.size += len(chunk)

    def close(self) -> int:
        if self._partial or self._too_long:  # a last line without a newline
            raw = bytes(self._partial)
            self._partial.clear()
            self._line(raw, self.size)
        if self.requests == 0:
            self.problems.append("the file has no requests (one JSON object a line)")
        if self.requests > jsonl.MAX_REQUESTS:
            self.problems.append(
                f"{self.requests} requests: a batch has at most {jsonl.MAX_REQUESTS}")
        if self.problems:
            raise InvalidInput.of(Problem("file", p) for p in self.problems)
        return self.requests

    def index(self) -> bytes:
        entries = array("Q", self._entries)
        if sys.byteorder != "little":
            entries.byteswap()
        return entries.tobytes()

    def _append(self, piece: bytes) -> None:
        if self._too_long:
            return
        if len(self._partial) + len(piece) > self.max_line_bytes:
            self._too_long = True
            self._partial.clear()
        else:
            self._partial += piece

    def _line(self, raw: bytes, end: int) -> None:
        number, start, too_long = self._number, self._start, self._too_long
        self._number, self._start, self._too_long = number + 1, end + 1, False
        if not too_long and not raw.strip():
            return  # a blank line: skipped, and still counted
        self.requests += 1
        if self.requests <= jsonl.MAX_REQUESTS:
            self._entries.extend((number, start, end))
        if len(self.problems) > jsonl.MAX_PROBLEMS:
            return  # stopped checking; still counting
        why = (f"longer than {self.max_line_bytes} bytes (the largest request, "
               "FIBERMILL_MAX_BODY_BYTES)" if too_long
               else jsonl.line_problem(raw, number, self._first_seen))
        if why is not None:
            self.problems.append(f"line {number}: {why}")
            if len(self.problems) == jsonl.MAX_PROBLEMS:
                self.problems.append(f"(stopped after {jsonl.MAX_PROBLEMS} problems)")


@dataclass(frozen=True)
class Checked:
    requests: int
    size: int  # bytes


def check_file(f: BinaryIO, max_bytes: int, max_line_bytes: int) -> Checked:
    """Check a whole file object from its start; PayloadTooLarge when it is over `max_bytes`,
    InvalidInput when it is not a batch input. Blocking: run it in a thread."""
    checker = Checker(max_line_bytes)
    f.seek(0)
    while chunk := f.read(READ_BYTES):
        if checker.size + len(chunk) > max_bytes:
            raise PayloadTooLarge(f"the file is larger than the limit of {max_bytes} bytes "
                                  "(FIBERMILL_MAX_FILE_BYTES)")
        checker.feed(chunk)
    return Checked(checker.close(), checker.size)
