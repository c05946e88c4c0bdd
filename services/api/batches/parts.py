"""A batch's finished lines out of Redis: written to the blob store a part at a time as they
finish (the driver flushes them), and put together into its output and error files, in input
order, when it ends.

A part is text, one finished line a line: `{index} {o|e}{the file line}` (JSON escapes every
newline, so a file line is one line). Parts hold lines in the order they finished; `assemble`
puts them in input order through temporary files on local disk (scratch, then one file each),
so it holds an index of the lines (a few integers each), not their text."""

import asyncio
import tempfile
import uuid
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import BinaryIO

from services.api.batches.bits import Bits
from services.api.batches.files import files_hour_prefix
from shared.blobstore.base import BlobStore
from shared.blobstore.keys import UNOWNED, hour_of


def part_key(batch_id: str, owner: str | None, created: int) -> str:
    """A new part's key, beside the batch's copy of its input (swept with the files of its
    hour): unique, so a replica that lost the batch cannot overwrite the part of the next."""
    return (f"{files_hour_prefix(hour_of(created))}{owner or UNOWNED}/"
            f"{batch_id}.part-{uuid.uuid4().hex}.txt")


def encode(lines: dict[int, bytes]) -> bytes:
    return b"".join(b"%d %s\n" % (i, entry) for i, entry in sorted(lines.items()))


@dataclass
class Assembled:
    """The output file and the error file (each a temporary file, closed by `close`) and how
    many lines each has."""

    output: BinaryIO
    errors: BinaryIO
    outputs: int = 0
    failures: int = 0

    def close(self) -> None:
        self.output.close()
        self.errors.close()


@dataclass
class _Scratch:
    """Lines as they are read from the parts: their text in a temporary file, where each is
    (index, offset, length, output or error) in arrays."""

    file: BinaryIO = field(default_factory=lambda: tempfile.TemporaryFile())  # noqa: SIM115
    seen: Bits = field(default_factory=Bits)
    index: array = field(default_factory=lambda: array("Q"))
    offset: array = field(default_factory=lambda: array("Q"))
    length: array = field(default_factory=lambda: array("Q"))
    ok: bytearray = field(default_factory=bytearray)
    partial: bytes = b""
    size: int = 0

    def feed(self, chunk: bytes) -> None:
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            number, _, entry = line.partition(b" ")
            i = int(number)
            if i in self.seen:
                continue  # written twice (a part retried): the first one stands
            self.seen.add(i)
            text = entry[1:] + b"\n"
            self.file.write(text)
            self.index.append(i)
            self.offset.append(self.size)
            self.length.append(len(text))
            self.ok.append(entry[:1] == b"o")
            self.size += len(text)

    def write(self) -> Assembled:
        """The lines in input order, into an output file and an error file."""
        done = Assembled(tempfile.TemporaryFile(), tempfile.TemporaryFile())  # noqa: SIM115
        for k in sorted(range(len(self.index)), key=self.index.__getitem__):
            self.file.seek(self.offset[k])
            text = self.file.read(self.length[k])
            if self.ok[k]:
                done.output.write(text)
                done.outputs += 1
            else:
                done.errors.write(text)
                done.failures += 1
        self.file.close()
        return done


async def assemble(blobs: BlobStore, keys: Iterable[str]) -> Assembled:
    """The output and error files of the lines in these parts."""
    scratch = _Scratch()
    try:
        for key in keys:
            async with await blobs.open(key) as blob:
                async for chunk in blob:
                    await asyncio.to_thread(scratch.feed, chunk)
        return await asyncio.to_thread(scratch.write)
    except BaseException:
        scratch.file.close()
        raise
