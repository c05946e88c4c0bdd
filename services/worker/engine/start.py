"""Telling the worker what is about to start on the device, before it starts.

The worker charges an attempt to each sub-request as it starts
(shared/redis_scripts/scripts/charge_attempts.lua): when a worker is lost, only what it was
running pays for it, and a sub-request that crashes every worker that runs it still runs out
of attempts. So the charge must land before the device runs the batch, and each delivery is
charged once however often the engine re-runs it (alone, after its batch failed).

That charge is a Redis round trip between two decode iterations, while the device waits. So a
text item that will join the very next iteration (`Arrival.starts_soon`: its engine has a slot
free for it) is charged with its lease instead, in the same script, and arrives `charged`: a
worker lost in the moment between the two costs it an attempt it did not get to use. Only items
that wait for room are charged here.
"""

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

log = logging.getLogger(__name__)

OnStart = Callable[[list[str]], Awaitable[None]]


class Startable(Protocol):
    tag: str | None  # the sub-request's member (`job:index`); None outside a worker
    charged: bool


async def announce_start(on_start: OnStart | None, entries: Iterable[Startable]) -> None:
    tags = []
    for e in entries:
        if e.tag is not None and not e.charged:
            tags.append(e.tag)
        e.charged = True
    if on_start is None or not tags:
        return
    try:
        await on_start(tags)
    except Exception as exc:  # Redis away for a moment: run uncharged rather than not at all
        log.warning("could not charge the attempts of %d sub-request(s): %s", len(tags), exc)
