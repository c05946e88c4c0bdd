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
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

log = logging.getLogger(__name__)

OnStart = Callable[[list[str]], Awaitable[None]]
# Told to each item as its batch starts on the device: the tags of the items starting with it
# (itself included) and the size of the batch they run in (the job's timeline and trace).
OnBatch = Callable[[list[str], int], None]


class Startable(Protocol):
    tag: str | None  # the sub-request's member (`job:index`); None outside a worker
    charged: bool
    on_batch: OnBatch | None


async def announce_start(on_start: OnStart | None, entries: Sequence[Startable],
                         size: int | None = None) -> None:
    """Charge what starts, then tell each item its batch: `size` rows in all (a text batch
    has running rows beside those starting), by default the entries."""
    tags = []
    for e in entries:
        if e.tag is not None and not e.charged:
            tags.append(e.tag)
        e.charged = True
    if on_start is not None and tags:
        try:
            await on_start(tags)
        except Exception as exc:  # Redis away for a moment: run uncharged rather than not at all
            log.warning("could not charge the attempts of %d sub-request(s): %s", len(tags),
                        exc)
    _tell_batch(entries, len(entries) if size is None else size)


def _tell_batch(entries: Sequence[Startable], size: int) -> None:
    hooked = [e for e in entries if e.on_batch is not None]
    if not hooked:
        return
    together = [e.tag for e in entries if e.tag is not None]
    for e in hooked:
        assert e.on_batch is not None
        e.on_batch(together, size)
