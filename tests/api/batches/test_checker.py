"""The chunked check of a batch input file: the same verdict and index whatever the chunks,
a line too long skipped without being held, nesting counted without recursion, and the index
of each request's line and bytes."""

import io
import json
import struct

import pytest

from services.api.batches import jsonl
from services.api.batches.checker import Checker, check_file
from shared.errors import InvalidInput, PayloadTooLarge


def request(custom_id: str, **body) -> bytes:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
                       "body": body or {"model": "tiny-gpt2", "prompt": "hi"}}).encode()


def fed(content: bytes, chunk: int, max_line: int = 10_000) -> Checker:
    checker = Checker(max_line)
    for start in range(0, len(content), chunk):
        checker.feed(content[start:start + chunk])
    return checker


def entries(checker: Checker) -> list[tuple[int, int, int]]:
    return list(struct.iter_unpack("<QQQ", checker.index()))


CONTENT = b"\n".join([request("a"), b"", b"  ", request("b"), request("c")])  # no last newline


@pytest.mark.parametrize("chunk", [1, 2, 7, 64, 10_000])
def test_any_chunking_gives_the_same_requests_and_index(chunk):
    checker = fed(CONTENT, chunk)
    assert checker.close() == 3
    assert checker.size == len(CONTENT)
    found = entries(checker)
    assert [line for line, _, _ in found] == [1, 4, 5]
    for (_line, start, end), custom_id in zip(found, "abc", strict=True):
        assert json.loads(CONTENT[start:end])["custom_id"] == custom_id


@pytest.mark.parametrize("chunk", [3, 100, 10_000])
def test_a_line_too_long_is_a_problem_and_is_not_held(chunk):
    long = request("b", prompt="x" * 500)
    held = Checker(200)
    held.feed(request("a") + b"\n" + long[:150])
    held.feed(long[150:400])
    assert len(held._partial) == 0  # dropped once past the limit
    checker = fed(b"\n".join([request("a"), long, request("c")]) + b"\n", chunk, max_line=200)
    with pytest.raises(InvalidInput) as caught:
        checker.close()
    assert [p.message for p in caught.value.problems] == [
        "line 2: longer than 200 bytes (the largest request, FIBERMILL_MAX_BODY_BYTES)"]


def test_depth_is_counted_without_recursion_and_strings_do_not_count():
    assert jsonl.too_deep(b"[" * 50_000 + b"]" * 50_000)
    assert not jsonl.too_deep(b"[" * 64 + b"]" * 64)
    assert jsonl.too_deep(b"[" * 65 + b"]" * 65)
    assert not jsonl.too_deep(b'{"a": "' + b"[{" * 100 + b'\\" [[["}')
    seen: dict[int, int] = {}
    deep = b'{"custom_id": "x", "body": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert jsonl.line_problem(deep, 3, seen) == \
        "nested deeper than 64 levels (the most a line may nest)"


def test_problems_stop_after_the_most_reported_and_requests_are_still_counted():
    content = b"\n".join([b"{bad"] * 30 + [request(str(i)) for i in range(5)])
    with pytest.raises(InvalidInput) as caught:
        check_file(io.BytesIO(content), 10**6, 10_000)
    messages = [p.message for p in caught.value.problems]
    assert len(messages) == jsonl.MAX_PROBLEMS + 1
    assert messages[-1] == f"(stopped after {jsonl.MAX_PROBLEMS} problems)"


def test_a_duplicate_custom_id_names_its_first_line():
    content = b"\n".join([request("a"), request("b"), request("a")])
    with pytest.raises(InvalidInput) as caught:
        check_file(io.BytesIO(content), 10**6, 10_000)
    assert [p.message for p in caught.value.problems] == [
        "line 3: custom_id 'a' appears again (first on line 1)"]


def test_a_file_over_the_limit_is_too_large_before_it_is_all_read():
    with pytest.raises(PayloadTooLarge, match="1000 bytes"):
        check_file(io.BytesIO(request("a") * 100), 1000, 10_000)
