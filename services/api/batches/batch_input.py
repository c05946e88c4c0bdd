"""A batch's input as its driver reads it: the batch's copy of its input file and the index of
its requests (checker.py) in the blob store, read by request index a window at a time with
ranged reads, so a driver holds the lines it is about to run, never the file.

A read of lines takes their index entries in one ranged read (at most WINDOW_LINES of them)
and their text in ranged reads of at most WINDOW_BYTES (a line longer than that alone)."""

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

from services.api.batches import jsonl
from services.api.batches.checker import ENTRY_BYTES
from shared.blobstore.base import BlobStore

WINDOW_LINES = 1024
WINDOW_BYTES = 1024 * 1024
_ENTRY = struct.Struct("<QQQ")


def spans(data: bytes) -> list[jsonl.Span]:
    return [jsonl.Span(*entry) for entry in _ENTRY.iter_unpack(data)]


class BatchInput:
    def __init__(self, blobs: BlobStore, input_key: str, index_key: str) -> None:
        self.blobs = blobs
        self.input_key = input_key
        self.index_key = index_key

    async def probe(self) -> None:
        """BlobNotFound unless both objects are there (a byte of each is read)."""
        await self.blobs.read_range(self.index_key, 0, 1)
        await self.blobs.read_range(self.input_key, 0, 1)

    async def read(self, indices: Iterable[int]) -> dict[int, jsonl.Raw]:
        """The text of these requests (request index -> its line)."""
        todo = sorted(set(indices))
        out: dict[int, jsonl.Raw] = {}
        k = 0
        while k < len(todo):
            first = todo[k]
            j = k
            while j + 1 < len(todo) and todo[j + 1] - first < WINDOW_LINES:
                j += 1
            entries = spans(await self.blobs.read_range(
                self.index_key, first * ENTRY_BYTES, (todo[j] + 1) * ENTRY_BYTES))
            wanted = [(i, entries[i - first]) for i in todo[k:j + 1]]
            for group in _byte_windows(wanted):
                lo, hi = group[0][1].start, group[-1][1].end
                data = await self.blobs.read_range(self.input_key, lo, hi)
                for i, span in group:
                    out[i] = jsonl.Raw(span.line, data[span.start - lo:span.end - lo])
            k = j + 1
        return out


def _byte_windows(wanted: list[tuple[int, jsonl.Span]]
                  ) -> list[list[tuple[int, jsonl.Span]]]:
    """The spans (in file order) grouped so that each group's bytes, from its first line's
    start to its last line's end, are at most WINDOW_BYTES, or one line."""
    groups: list[list[tuple[int, jsonl.Span]]] = []
    for item in wanted:
        if groups and item[1].end - groups[-1][0][1].start <= WINDOW_BYTES:
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


@dataclass
class Window:
    """The lines a driver has read to submit next: `content` their text, one after another,
    and `spans` where each request is in it. `len(spans)` is the batch's number of requests;
    `spans[i]` of a request not in the window raises KeyError."""

    total: int = 0
    at: dict[int, jsonl.Span] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.total

    def __getitem__(self, i: int) -> jsonl.Span:
        return self.at[i]

    def __contains__(self, i: int) -> bool:
        return i in self.at


def window(total: int, raws: dict[int, jsonl.Raw]) -> tuple[bytes, Window]:
    """The text of `raws` and a Window of them."""
    pieces, at, pos = [], {}, 0
    for i, raw in raws.items():
        at[i] = jsonl.Span(raw.line, pos, pos + len(raw.text))
        pieces.append(raw.text)
        pos += len(raw.text)
    return b"".join(pieces), Window(total, at)
