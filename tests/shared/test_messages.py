"""The messages between processes: each one read back as it was sent, completion entries read
as the Lua scripts write them on a real Redis, and the enums where strings used to be."""

import pytest
from pydantic import ValidationError

from shared import names
from shared.job import JobMeta, JobStatus
from shared.jobstore import JobStore, NewJob
from shared.messages import (
    CancelNotice,
    CompletionEntry,
    CompletionKind,
    DeadLetter,
    GeneratedImage,
    GeneratedText,
    ImageItem,
    JobError,
    Progress,
    ProgressEvent,
    StatusEvent,
    StepData,
    StepEvent,
    SubRequest,
    SubResult,
    TextItem,
    WorkerHeartbeat,
    decode_event,
)

TEXT = SubRequest(job_id="j1", index=0, model="tiny-gpt2",
                  item=TextItem(prompt="a", max_new_tokens=2, stop=["\n"]))
IMAGE = SubRequest(job_id="j1", index=3, model="tiny-sd",
                   item=ImageItem(prompt="a", width=64, height=64, steps=4, guidance_scale=7.5,
                                  seed=9))

MESSAGES = [
    TEXT,
    IMAGE,
    SubResult(index=0, output=GeneratedText(text="hi", finish_reason="stop", tokens=2),
              worker="w/1", started_at=1.0, finished_at=2.0),
    SubResult(index=3, output=GeneratedImage(seed=9, width=64, height=64)),
    SubResult(index=1, error=JobError(code="model_error", message="boom")),
    CancelNotice(job_id="j1"),
    WorkerHeartbeat(id="w/1", name="w", host="h", pid=1, device="cpu", models=["m"],
                    started_at=1.0, seen_at=2.0),
    DeadLetter.of(IMAGE, JobError(code="dead_lettered", message="given up"), attempts=3, at=3.0),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_a_message_decodes_to_what_was_encoded(message):
    assert type(message).decode(message.encode()) == message


def test_a_text_item_asks_for_at_least_one_token():
    with pytest.raises(ValidationError, match="max_new_tokens"):
        TextItem(prompt="a", max_new_tokens=0)


def test_a_sub_request_survives_the_celery_task_argument():
    for sub in (TEXT, IMAGE):
        assert SubRequest.from_task_arg(sub.task_args()[0]) == sub
    assert IMAGE.member == "j1:3"


def test_live_events_are_told_apart_by_their_name():
    step = StepEvent(data=StepData(index=1, step=2, steps=4))
    progress = ProgressEvent(data=Progress(done=1, total=2))
    status = StatusEvent(data={"id": "j1", "status": "running"})
    for event in (step, progress, status):
        assert decode_event(event.encode()) == event
    with pytest.raises(ValidationError):
        decode_event('{"event": "nonsense", "data": {}}')


def test_an_unknown_finish_reason_is_refused():
    with pytest.raises(ValidationError):
        GeneratedText(text="x", finish_reason="tired", tokens=1)


async def test_completion_entries_read_as_the_scripts_write_them(store: JobStore, aredis):
    # A job whose start and end are webhooks: the only ones with `started` and `final` entries
    # (tests/shared/test_jobstore.py has the job without).
    hooks = JobMeta(webhook="https://example.com/hook",
                    webhook_events_filter=["start", "completed"])
    await store.create(NewJob("j1", "text-generation", "tiny-gpt2", {"prompts": ["a", "b"]}, 2,
                              hooks))
    await store.acquire_lease(TEXT, "w1", 30, 3)  # started
    await store.store_result("j1", SubResult(index=0, error=JobError(code="x", message="y")))
    await store.finalize("j1", JobStatus.FAILED, [None, None])
    raw = await aredis.xrange(names.COMPLETIONS_STREAM)
    entries = [CompletionEntry.from_fields(fields) for _id, fields in raw]
    assert entries == [
        CompletionEntry(job="j1", kind=CompletionKind.STARTED),
        CompletionEntry(job="j1", kind=CompletionKind.RESULT, index=0, ok=False),
        CompletionEntry(job="j1", kind=CompletionKind.FINAL),
    ]
