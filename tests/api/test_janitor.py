"""The janitor: re-sends a sub-request whose lease expired, dead-letters one out of attempts."""

import base64
import json

from services.api.janitor import Janitor
from services.api.joiner import Joiner
from shared import names
from shared.messages import SubRequest
from shared.queue_depth import priority_lists


async def _queued(aredis, model: str) -> list[SubRequest]:
    """The sub-requests waiting in a model's Celery queue (kombu's JSON envelope)."""
    out = []
    raws = [r for key in priority_lists(model) for r in await aredis.lrange(key, 0, -1)]
    for raw in raws:
        message = json.loads(raw)
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        out.append(SubRequest.model_validate(args[0]))
    return out


async def _job(store):
    await store.create(
        "j1",
        "text-generation",
        "tiny-gpt2",
        {"prompts": ["a", "b"], "seed": 5, "max_new_tokens": 3},
        2,
    )
    await store.mark_dispatched("j1")


async def test_expired_lease_is_sent_again(store, aredis, dispatcher, settings, lifecycle):
    await _job(store)
    rec = await store.get("j1")
    sub = dispatcher.subrequests(rec)[1]
    await store.acquire_lease(sub, "dead-worker", lease_seconds=-1, max_attempts=2)
    janitor = Janitor(store, dispatcher, lifecycle, settings)
    assert await janitor.sweep() == 1
    queued = await _queued(aredis, "tiny-gpt2")
    assert len(queued) == 1
    resent = queued[0]
    assert (resent.job_id, resent.index, resent.item.prompt, resent.item.seed) == ("j1", 1, "b", 6)
    assert await janitor.sweep() == 0  # the lease was taken away once


async def test_sub_request_out_of_attempts_is_dead_lettered(
    store, aredis, dispatcher, settings, lifecycle
):
    await _job(store)
    sub = dispatcher.subrequests(await store.get("j1"))[0]
    for _ in range(settings.max_attempts):
        await store.acquire_lease(sub, "w", lease_seconds=-1, max_attempts=settings.max_attempts)
        await store.claim_expired_leases()
    await store.acquire_lease(sub, "w", lease_seconds=-1, max_attempts=settings.max_attempts + 1)
    janitor = Janitor(store, dispatcher, lifecycle, settings)
    assert await janitor.sweep() == 1
    assert await _queued(aredis, "tiny-gpt2") == []
    letter = json.loads(await aredis.lindex(names.DEAD_LETTER, 0))
    assert letter["subrequest"]["index"] == 0 and "attempts" in letter["reason"]
    joiner = Joiner(aredis, lifecycle, settings, "api")
    await joiner.ensure_group()
    await joiner.reclaim()
    resp = await aredis.xreadgroup(names.JOINER_GROUP, "api", {names.COMPLETIONS_STREAM: ">"})
    await joiner._handle_batch(resp[0][1])
    rec = await store.get("j1")
    assert rec.status == "failed" and rec.error.code == "dead_lettered"


async def test_interrupted_dispatch_is_completed(store, aredis, dispatcher, settings, lifecycle):
    await store.create("j2", "text-generation", "tiny-gpt2", {"prompts": ["a", "b", "c"]}, 3)
    await aredis.zadd(names.DISPATCHING, {"j2": 0})  # its creator died long ago
    janitor = Janitor(store, dispatcher, lifecycle, settings)
    assert await janitor.sweep() == 3
    assert len(await _queued(aredis, "tiny-gpt2")) == 3
