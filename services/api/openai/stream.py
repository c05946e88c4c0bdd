"""A text job's `output` events as OpenAI's streamed chunks (`chat.completion.chunk`, or
`text_completion` pieces), from the job's live channel: tokens reach the client as the worker
decodes them, not when the job ends.

The job store stays the truth. Each event says where its text starts in the output, so a lost
event (pub/sub is best effort; a slow reader's backlog drops the oldest) shows as a gap, and a
sub-request run again (after a drain or a lost worker) as a repeat, which is skipped. When the
job ends (its final wake, or a quiet second finds it so), whatever of each choice's text was not
sent, from its first gap on, comes from the stored output: the streamed text always adds up to
it, never with a piece twice.

Asked log-probabilities travel the same way: each chunk carries those of the tokens that came
with its event (an event's text may lag its tokens by a few characters, so a chunk's entries
need not be its text's), a repeat's are skipped by the count of tokens, and a lost event's come
from the stored output with the rest of its choice's text."""

from collections.abc import AsyncIterator
from typing import Any

from services.api.events import POLL_SECONDS, Listener
from services.api.openai import logprobs
from services.api.openai.schemas import ChatCompletionRequest, CompletionRequest
from services.api.openai.translate import answer_id, echoed, failure, usage
from shared.job import JobStatus
from shared.jobstore import JobRecord, JobStore
from shared.messages import OutputEvent, TokenLogprob, decode_event

TextRequest = ChatCompletionRequest | CompletionRequest


class Chunks:
    """Builds the chunks of one streamed answer."""

    def __init__(self, req: TextRequest, rec: JobRecord) -> None:
        self.req = req
        self.chat = isinstance(req, ChatCompletionRequest)
        self.head: dict[str, Any] = {"id": answer_id(req, rec.id),
                     "object": "chat.completion.chunk" if self.chat else "text_completion",
                     "created": int(rec.created_at), "model": rec.model}
        if self.chat:
            self.head["system_fingerprint"] = None
        if req.usage_streamed:
            self.head["usage"] = None
        self.offsets: dict[int, logprobs.TextOffsets] = {}  # a completion's, per choice

    def opening(self, index: int) -> dict[str, Any] | None:
        """A chat choice opens with its role; a completion that echoes, with its prompt."""
        if self.chat:
            return self._choice(index, {"role": "assistant", "content": ""})
        if isinstance(self.req, CompletionRequest) and self.req.echo:
            return self._choice(index, echoed(self.req, index))
        return None

    def text(self, index: int, text: str, finish_reason: str | None = None,
             tokens: list[TokenLogprob] | None = None) -> dict[str, Any]:
        """A piece of choice `index`'s text, with the log-probabilities of `tokens` (null
        when none were asked, or none came with it)."""
        chunk = self._choice(index, {"content": text} if self.chat and text else {}
                             if self.chat else text, finish_reason)
        if tokens and self.req.alternatives is not None:
            chunk["choices"][0]["logprobs"] = self._logprobs(index, tokens)
        return chunk

    def usage(self, outputs: list[dict[str, Any]]) -> dict[str, Any]:
        return {**self.head, "choices": [], "usage": usage(self.req, outputs)}

    def _choice(self, index: int, delta: Any, finish_reason: str | None = None
                ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index}
        choice["delta" if self.chat else "text"] = delta
        choice |= {"logprobs": None, "finish_reason": finish_reason}
        return {**self.head, "choices": [choice]}

    def _logprobs(self, index: int, tokens: list[TokenLogprob]) -> dict[str, Any]:
        if isinstance(self.req, ChatCompletionRequest):
            return logprobs.chat(tokens)
        offsets = self.offsets.setdefault(
            index, logprobs.TextOffsets(len(echoed(self.req, index))))
        return logprobs.completion(tokens, offsets)


async def relay(req: TextRequest, rec: JobRecord, listener: Listener, store: JobStore
                ) -> AsyncIterator[dict[str, Any]]:
    """The chunks of `rec`'s job until every choice has finished (then usage, if asked), or
    an `{"error": ...}` payload if the job failed or was canceled."""
    chunks = Chunks(req, rec)
    sent = [""] * rec.total
    scored = [0] * rec.total  # tokens whose log-probabilities were sent, per choice
    outputs: list[dict[str, Any]] = [{} for _ in range(rec.total)]
    open_ = set(range(rec.total))
    gaps: set[int] = set()  # choices that missed an event: the rest comes from the store
    for index in range(rec.total):
        if (first := chunks.opening(index)) is not None:
            yield first
    while open_:
        item = await listener.next(timeout=POLL_SECONDS)
        if isinstance(item, bytes):
            event = decode_event(item)
            if isinstance(event, OutputEvent) and event.data.index in open_ - gaps:
                d = event.data
                start = d.tokens - len(d.logprobs or [])  # the event's first scored token
                if d.offset > len(sent[d.index]) or (d.logprobs and start > scored[d.index]):
                    gaps.add(d.index)  # an event was lost: the stored output fills in at the end
                    continue
                new = d.text[len(sent[d.index]) - d.offset:]  # a run again repeats what was sent
                sent[d.index] += new
                tokens = (d.logprobs or [])[scored[d.index] - start:]
                scored[d.index] += len(tokens)
                if d.finish_reason is not None:
                    open_.discard(d.index)
                    outputs[d.index] = {"tokens": d.tokens, "prompt_tokens": d.prompt_tokens}
                    yield chunks.text(d.index, new, d.finish_reason.value, tokens)
                elif new or tokens:
                    yield chunks.text(d.index, new, tokens=tokens)
            continue
        rec = item if isinstance(item, JobRecord) else await store.get(rec.id)
        if not rec.final:
            continue
        if rec.status != JobStatus.SUCCEEDED:
            yield failure(rec)[1]
            return
        for index in sorted(open_):
            stored = (rec.output or [])[index] or {}
            text = stored.get("text", "")
            rest = text[len(sent[index]):]  # what was sent is a prefix of it (offsets)
            tokens = (logprobs.entries(stored.get("logprobs")) or [])[scored[index]:]
            outputs[index] = stored
            yield chunks.text(index, rest, stored.get("finish_reason"), tokens)
        open_.clear()
    if req.usage_streamed:
        yield chunks.usage(outputs)
