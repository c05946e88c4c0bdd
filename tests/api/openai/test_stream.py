"""A job's output events as OpenAI chunks: what was sent always adds up to the stored output,
whatever the channel lost or repeated."""

import asyncio

from services.api.events import Listener
from services.api.openai.schemas import ChatCompletionRequest, CompletionRequest
from services.api.openai.stream import relay
from shared.job import JobStatus
from shared.jobstore import JobRecord
from shared.messages import FinishReason, OutputData, OutputEvent

TEXT = "Return the number of items."


class Store:
    """The job as the store has it once final (the part of the store `relay` reads)."""

    def __init__(self, rec: JobRecord) -> None:
        self.rec = rec

    async def get(self, job_id: str) -> JobRecord:
        return self.rec


def _record(status=JobStatus.RUNNING, total=1, output=None) -> JobRecord:
    return JobRecord("01" * 16, "text-generation", "pydoc-gpt2", status, {}, total, 1.0,
                     output=output)


def _event(text: str, offset: int, index: int = 0, finish: bool = False) -> bytes:
    return OutputEvent(data=OutputData(
        index=index, text=text, offset=offset, tokens=offset + len(text),
        finish_reason=FinishReason.STOP if finish else None,
        prompt_tokens=5 if finish else None)).encode().encode()


def _run(req, events: list[bytes], final: JobRecord | None = None, total: int = 1
         ) -> list[dict]:
    async def go() -> list[dict]:
        listener = Listener("job")
        for e in events:
            listener.push(e)
        if final is not None:
            listener.push(final)
        running = _record(total=total)
        return [c async for c in relay(req, running, listener, Store(final or running))]

    return asyncio.run(go())


CHAT = ChatCompletionRequest(model="pydoc-gpt2", messages=[{"role": "user", "content": "x"}],
                             stream_options={"include_usage": True})


def _content(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])


def test_deltas_become_chunks_that_open_with_the_role_and_end_with_usage():
    chunks = _run(CHAT, [_event("Return ", 0), _event("the number", 7),
                         _event(" of items.", 17, finish=True)])
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert _content(chunks) == TEXT
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": 5, "completion_tokens": len(TEXT), "total_tokens": 5 + len(TEXT)}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_a_repeat_from_a_second_run_is_not_sent_twice():
    chunks = _run(CHAT, [_event("Return ", 0), _event("the", 7),
                         _event("Return the num", 0), _event("ber of items.", 14, finish=True)])
    assert _content(chunks) == TEXT


def test_a_lost_event_is_filled_in_from_the_stored_output():
    done = _record(JobStatus.SUCCEEDED, output=[{"text": TEXT, "finish_reason": "length",
                                                 "tokens": 6, "prompt_tokens": 5}])
    chunks = _run(CHAT, [_event("Return ", 0), _event(" of items.", 17, finish=True)], done)
    assert _content(chunks) == TEXT
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 6


def test_a_failed_job_ends_the_stream_with_an_openai_error():
    failed = _record(JobStatus.FAILED, total=2)
    chunks = _run(CompletionRequest(model="tiny-gpt2", prompt="x", n=2), [], failed, total=2)
    assert chunks[-1]["error"]["code"] == "job_failed"


def test_completions_stream_text_pieces_per_choice():
    req = CompletionRequest(model="tiny-gpt2", prompt="Hi", n=2, echo=True)
    chunks = _run(req, [_event("a", 0, index=1), _event("b", 0, index=0, finish=True),
                        _event("c", 1, index=1, finish=True)], total=2)
    by_index: dict[int, str] = {0: "", 1: ""}
    for c in chunks:
        by_index[c["choices"][0]["index"]] += c["choices"][0]["text"]
    assert by_index == {0: "Hib", 1: "Hiac"}  # echoed prompt first
    assert all(c["object"] == "text_completion" for c in chunks)
