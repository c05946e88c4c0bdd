"""A job's output events as OpenAI chunks: what was sent always adds up to the stored output,
whatever the channel lost or repeated."""

import asyncio

from services.api.events import Listener
from services.api.openai.schemas import ChatCompletionRequest, CompletionRequest
from services.api.openai.stream import relay
from shared.job import JobStatus
from shared.jobstore import JobRecord
from shared.messages import FinishReason, OutputData, OutputEvent, TokenLogprob, TopLogprob

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


# Log-probabilities ----------------------------------------------------------------------------

WORDS = ["Return", " the", " number", " of", " items", "."]  # TEXT, one token a word


def _scored(word: str) -> TokenLogprob:
    alternatives = [TopLogprob(token=w, bytes=list(w.encode()), logprob=-1.0 - i)
                    for i, w in enumerate([word, " a"])]
    return TokenLogprob(token=word, bytes=list(word.encode()), logprob=-1.0,
                        top_logprobs=alternatives)


def _scored_event(first: int, last: int, index: int = 0, behind: int = 0, lag: int = 0
                  ) -> bytes:
    """Words [first, last) as one event: their log-probabilities, and their text less the
    `lag` last characters (a later event carries them) and with the `behind` last characters
    of the previous event's words (which it left)."""
    before, upto = "".join(WORDS[:first]), "".join(WORDS[:last])
    offset = len(before) - behind
    text = upto[offset:len(upto) - lag]
    finish = last == len(WORDS)
    return OutputEvent(data=OutputData(
        index=index, text=text, offset=offset, tokens=last,
        finish_reason=FinishReason.STOP if finish else None,
        prompt_tokens=5 if finish else None,
        logprobs=[_scored(w) for w in WORDS[first:last]])).encode().encode()


CHAT_LP = ChatCompletionRequest(model="pydoc-gpt2", messages=[{"role": "user", "content": "x"}],
                                logprobs=True, top_logprobs=2)


def _chat_tokens(chunks: list[dict]) -> list[str]:
    return [t["token"] for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
            for t in c["choices"][0]["logprobs"]["content"]]


def test_chat_chunks_carry_their_tokens_logprobs_once_each():
    # The second event's text lags its tokens by 3 characters; a run again repeats the first.
    chunks = _run(CHAT_LP, [_scored_event(0, 2), _scored_event(2, 4, lag=3),
                            _scored_event(0, 2), _scored_event(4, 6, behind=3)])
    assert chunks[0]["choices"][0]["logprobs"] is None  # the role's chunk has no tokens
    assert _content(chunks) == TEXT
    assert _chat_tokens(chunks) == WORDS
    entry = chunks[1]["choices"][0]["logprobs"]["content"][0]
    assert entry == {"token": "Return", "logprob": -1.0, "bytes": list(b"Return"),
                     "top_logprobs": [{"token": "Return", "logprob": -1.0,
                                       "bytes": list(b"Return")},
                                      {"token": " a", "logprob": -2.0, "bytes": [32, 97]}]}
    assert chunks[1]["choices"][0]["logprobs"]["refusal"] is None
    # Unasked, the same events stream no log-probabilities.
    plain = _run(CHAT, [_scored_event(0, 2), _scored_event(2, 6)])
    assert all(c["choices"][0]["logprobs"] is None for c in plain if c["choices"])


def test_a_lost_events_logprobs_come_from_the_stored_output():
    stored = [{"token": w, "bytes": list(w.encode()), "logprob": -1.0, "top_logprobs": []}
              for w in WORDS]
    done = _record(JobStatus.SUCCEEDED, output=[{"text": TEXT, "finish_reason": "stop",
                                                 "tokens": 6, "prompt_tokens": 5,
                                                 "logprobs": stored}])
    # The event of words 2-3, whose text lagged all of theirs, is lost: the next one's text
    # starts where the sent text ends, but its tokens do not start where the sent ones do.
    lag = len(" number of")
    chunks = _run(CHAT_LP, [_scored_event(0, 2), _scored_event(4, 6, behind=lag)], done)
    assert _content(chunks) == TEXT
    assert _chat_tokens(chunks) == WORDS
    # A lost event's text shows the gap as well.
    chunks = _run(CHAT_LP, [_scored_event(0, 2), _scored_event(4, 6)], done)
    assert _content(chunks) == TEXT and _chat_tokens(chunks) == WORDS


def test_completion_chunks_carry_legacy_logprobs_with_offsets_into_the_text():
    req = CompletionRequest(model="tiny-gpt2", prompt="Hi", n=2, echo=True, logprobs=1)
    chunks = _run(req, [_scored_event(0, 3, index=1, lag=2), _scored_event(0, 6, index=0),
                        _scored_event(3, 6, index=1, behind=2)], total=2)
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        text = "".join(c["text"] for c in mine)
        assert text == "Hi" + TEXT
        pieces = [c["logprobs"] for c in mine if c["logprobs"]]
        assert all(list(p) == ["tokens", "token_logprobs", "top_logprobs", "text_offset"]
                   for p in pieces)
        assert [t for p in pieces for t in p["tokens"]] == WORDS
        offsets = [o for p in pieces for o in p["text_offset"]]
        assert [text[o:o + len(w)] for o, w in zip(offsets, WORDS, strict=True)] == WORDS
        assert pieces[0]["top_logprobs"][0] == {"Return": -1.0, " a": -2.0}
