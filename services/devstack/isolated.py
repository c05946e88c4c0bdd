"""In-process measurements, each in a fresh interpreter of its own."""

import asyncio
import concurrent.futures
import multiprocessing
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def isolated(measure, *args):
    """Run `measure(*args)` in a fresh interpreter and return its result. In one process, each
    thread that has run torch keeps its own OpenMP team, spinning for a while after its last
    op: a contender measured on another thread after `generate` (the engine runs on its
    device thread) loses up to a third of its speed to the first one's idle team."""
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        return pool.submit(measure, *args).result()


def run_engine(pipeline: Any, main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` for a measurement of `pipeline`'s engine, then the pipeline's
    device thread is let go, so that the interpreter can exit."""
    try:
        return asyncio.run(main)
    finally:
        executor = getattr(pipeline, "device_executor", None)
        if executor is not None:
            executor.shutdown(wait=True)
