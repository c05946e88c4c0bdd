"""Settling an item's future once: a stop, a failure or a result may each get there first."""

import asyncio


def settle(future: asyncio.Future, result, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)
