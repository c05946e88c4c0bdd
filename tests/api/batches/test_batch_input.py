"""A batch's lines read from the blob store by request index: one ranged read of their index
entries and ranged reads of at most a window of bytes of the input, never the whole of it."""

import io
import json

import pytest

from services.api.batches import batch_input
from services.api.batches.batch_input import BatchInput, window
from services.api.batches.checker import Checker, check_file
from shared.blobstore.local import LocalBlobStore


def content(n: int, pad: int = 0) -> bytes:
    return b"".join(json.dumps({"custom_id": f"c{i}", "method": "POST",
                                "url": "/v1/completions",
                                "body": {"prompt": "p" * pad}}).encode() + b"\n\n"
                    for i in range(n))


@pytest.fixture
async def stored(tmp_path, monkeypatch):
    """An input of 500 lines (about 230 bytes each, a blank line after each) and its index,
    with windows of 2 KiB and 64 index entries; each ranged read is recorded."""
    monkeypatch.setattr(batch_input, "WINDOW_BYTES", 2048)
    monkeypatch.setattr(batch_input, "WINDOW_LINES", 64)
    blobs = LocalBlobStore(tmp_path)
    data = content(500, pad=150)
    checker = Checker(10_000)
    checker.feed(data)
    assert checker.close() == 500 == check_file(io.BytesIO(data), 10**7, 10_000).requests
    await blobs.put("files/in.jsonl", data)
    await blobs.put("files/in.index", checker.index())
    reads: list[tuple[str, int]] = []
    real = blobs.read_range

    async def spy(key, start, end):
        got = await real(key, start, end)
        reads.append((key, len(got)))
        return got

    monkeypatch.setattr(blobs, "read_range", spy)
    yield BatchInput(blobs, "files/in.jsonl", "files/in.index"), data, reads
    await blobs.close()


async def test_lines_are_read_by_index_a_window_at_a_time(stored):
    source, data, reads = stored
    lines = data.split(b"\n")
    got = await source.read([0, 1, 2, 499, 250, 3])
    assert sorted(got) == [0, 1, 2, 3, 250, 499]
    for i, raw in got.items():
        assert raw.line == 2 * i + 1 and raw.text == lines[2 * i]
    everything = await source.read(range(500))
    assert [json.loads(r.text)["custom_id"] for r in everything.values()] == \
        [f"c{i}" for i in range(500)]
    assert max(n for key, n in reads if key == "files/in.jsonl") <= 2048
    assert max(n for key, n in reads if key == "files/in.index") <= 64 * 24
    assert sum(n for key, n in reads if key == "files/in.jsonl") < 2 * len(data)


async def test_a_line_longer_than_a_window_is_read_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(batch_input, "WINDOW_BYTES", 100)
    blobs = LocalBlobStore(tmp_path)
    data = content(3, pad=300)
    checker = Checker(10_000)
    checker.feed(data)
    checker.close()
    await blobs.put("files/in.jsonl", data)
    await blobs.put("files/in.index", checker.index())
    got = await BatchInput(blobs, "files/in.jsonl", "files/in.index").read([2, 0, 1])
    assert [json.loads(got[i].text)["custom_id"] for i in range(3)] == ["c0", "c1", "c2"]


def test_a_window_holds_its_lines_and_knows_the_batch_size():
    from services.api.batches.jsonl import Raw, read

    text, spans = window(10, {4: Raw(9, b'{"custom_id": "x", "url": "u", "body": {}}'),
                              5: Raw(11, b'{"custom_id": "y", "url": "u", "body": {}}')})
    assert len(spans) == 10 and 4 in spans and 3 not in spans
    assert read(text, spans[5]).custom_id == "y" and read(text, spans[5]).line == 11
    with pytest.raises(KeyError):
        spans[3]
