"""End to end with OpenAI's own client: the Files and Batch APIs on a real stack (two API
replicas, two CPU workers). A 1,000-line batch mixing chat and completion lines, some invalid,
through to its output and error files; a batch cancelled half-way; a worker SIGKILLed during a
batch with nothing lost."""

import json
import os
import signal
import time

import pytest
from openai import OpenAI

from shared import names

pytestmark = pytest.mark.e2e

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
ENDED = {"completed", "failed", "expired", "cancelled"}


@pytest.fixture(scope="module")
def client(stack):
    with OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0,
                timeout=60) as c:
        yield c


def _chat(custom_id: str, tokens: int, model: str = "pydoc-gpt2") -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": CHAT,
            "body": {"model": model, "max_tokens": tokens, "temperature": 0,
                     "messages": [{"role": "user", "content": f"Explain {custom_id}"}]}}


def _completion(custom_id: str, tokens: int, model: str = "tiny-gpt2") -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": COMPLETIONS,
            "body": {"model": model, "max_tokens": tokens, "prompt": f"Return {custom_id}"}}


def _upload(client: OpenAI, lines: list[dict]) -> str:
    content = "".join(json.dumps(x) + "\n" for x in lines).encode()
    f = client.files.create(file=("batch.jsonl", content), purpose="batch")
    assert f.purpose == "batch" and f.bytes == len(content)
    return f.id


def _wait(client: OpenAI, batch_id: str, until: set[str], timeout: float = 180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in until:
            return batch
        time.sleep(0.25)
    raise AssertionError(f"batch {batch_id} still {batch.status} after {timeout}s: {batch}")


def _lines(client: OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


def _each_once(lines: list[dict], sent: list[dict]) -> None:
    ids = [x["custom_id"] for x in lines]
    assert sorted(ids) == sorted(x["custom_id"] for x in sent)  # each exactly once


def test_a_thousand_line_batch_through_the_openai_client(client):
    lines = []
    for i in range(1000):
        lines.append(_chat(f"req-{i}", 4) if i % 2 else _completion(f"req-{i}", 4))
    bad = {  # line index -> the status its error line must have
        10: (_completion("req-10", 1000), 400),  # over tiny-gpt2's 256 new tokens
        11: (_chat("req-11", 4, model="no-such-model"), 404),
        500: (_chat("req-500", 4, model="tiny-gpt2"), 400),  # no chat template
        999: (_chat("req-999", 500), 400),  # over pydoc-gpt2's 127
    }
    for i, (line, _status) in bad.items():
        lines[i] = line
    batch = client.batches.create(input_file_id=_upload(client, lines), endpoint=CHAT,
                                  completion_window="24h", metadata={"suite": "e2e"})
    assert batch.status == "validating" and batch.metadata == {"suite": "e2e"}

    done = _wait(client, batch.id, ENDED)
    assert done.status == "completed", done
    assert done.endpoint == CHAT
    counts = done.request_counts
    assert (counts.total, counts.completed, counts.failed) == (1000, 996, 4)
    assert done.in_progress_at <= done.finalizing_at <= done.completed_at

    out = _lines(client, done.output_file_id)
    errors = _lines(client, done.error_file_id)
    _each_once(out + errors, lines)
    by_id = {x["custom_id"]: x for x in out}
    assert [x["custom_id"] for x in out] == [x["custom_id"] for i, x in enumerate(lines)
                                             if i not in bad]  # in input order
    for i, sent in enumerate(lines):
        if i in bad:
            continue
        resp = by_id[sent["custom_id"]]["response"]
        assert resp["status_code"] == 200
        body = resp["body"]
        if sent["url"] == CHAT:
            assert body["object"] == "chat.completion" and body["model"] == "pydoc-gpt2"
            assert body["choices"][0]["message"]["role"] == "assistant"
        else:
            assert body["object"] == "text_completion" and body["model"] == "tiny-gpt2"
        assert body["usage"]["completion_tokens"] <= 4
    assert [x["custom_id"] for x in errors] == [f"req-{i}" for i in sorted(bad)]
    for x, i in zip(errors, sorted(bad), strict=True):
        assert x["response"]["status_code"] == bad[i][1], x
        assert x["response"]["body"]["error"]["message"]
    listed = client.batches.list(limit=5)
    assert done.id in [b.id for b in listed.data]
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"


def test_a_batch_cancelled_half_way(client, stack):
    # 100 new tokens and the short conversation fit pydoc-gpt2's 128 positions.
    lines = [_completion(f"long-{i}", 200) if i % 2 else _chat(f"long-{i}", 100)
             for i in range(300)]
    batch = client.batches.create(input_file_id=_upload(client, lines),
                                  endpoint=COMPLETIONS, completion_window="24h")
    deadline = time.time() + 120
    while client.batches.retrieve(batch.id).request_counts.completed < 5:
        assert time.time() < deadline, "no line finished"
        time.sleep(0.1)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at

    done = _wait(client, batch.id, ENDED, timeout=60)
    assert done.status == "cancelled" and done.cancelled_at >= done.cancelling_at
    out = _lines(client, done.output_file_id)
    errors = _lines(client, done.error_file_id)
    _each_once(out + errors, lines)
    assert 5 <= len(out) < 300
    assert all(x["response"]["status_code"] == 200 for x in out)
    assert {x["error"]["code"] for x in errors} == {"batch_cancelled"}
    assert done.request_counts.completed == len(out)
    assert done.request_counts.failed == len(errors)
    # Nothing of the batch is left running.
    time.sleep(1)
    assert sum(stack.redis.zcard(names.backlog_key(m)) for m in ("tiny-gpt2", "pydoc-gpt2")) == 0


def _leased(stack) -> list[str]:
    return [m.decode() for m in stack.redis.zrange(names.LEASES, 0, -1)]


def test_a_worker_killed_during_a_batch_loses_no_line(client, stack):
    lines = [_completion(f"kill-{i}", 32) if i % 2 else _chat(f"kill-{i}", 32)
             for i in range(80)]
    batch = client.batches.create(input_file_id=_upload(client, lines), endpoint=CHAT,
                                  completion_window="24h")
    deadline = time.time() + 60
    owners: list[str] = []
    while time.time() < deadline and not owners:
        owners = [o.decode() for o in (stack.redis.hget(names.job_key(j), names.owner_field(i))
                                        for j, i in map(names.split_member, _leased(stack))) if o]
        time.sleep(0.02)
    assert owners, "no line of the batch started"
    os.kill(int(owners[0].rsplit("/", 1)[1]), signal.SIGKILL)

    done = _wait(client, batch.id, ENDED)
    assert done.status == "completed", (done, stack.logs())
    assert (done.request_counts.completed, done.request_counts.failed) == (80, 0)
    assert done.error_file_id is None
    out = _lines(client, done.output_file_id)
    _each_once(out, lines)
    assert all(x["response"]["status_code"] == 200 for x in out)
