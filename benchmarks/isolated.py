"""In-process measurements, each in a fresh interpreter of its own."""

import asyncio
import concurrent.futures
import multiprocessing
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any


def isolated(measure, *args):
    """Run `measure(*args)` in a fresh interpreter and return its result. In one process, each
    thread that has run torch keeps its own OpenMP team, spinning for a while after its last
    op: a contender measured on another thread after `generate` (the engine runs on its
    device thread) loses up to a third of its speed to the first one's idle team."""
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        return pool.submit(measure, *args).result()


@dataclass
class Bursts:
    times: list[float]  # seconds of each timed burst
    results: list[Any]  # the timed bursts' results, in order


def engine_bursts(spec: Any, item: Any, n: int, reps: int, min_seconds: float,
                  threads: int | None = None, warmups: int = 3) -> Bursts:
    """`spec`'s engine fed directly (pipeline + `Engine`, no HTTP, Redis or Celery): bursts of
    `n` copies of `item`, announced together through `Engine.arrival` as the worker announces
    the sub-requests it has taken, repeated at least `reps` times and for at least
    `min_seconds`, after `warmups` untimed ones (a model's first bursts are slower while the
    allocator and the kernels' caches fill). `threads`: intra-op threads (None: every core).
    Call it through `isolated`."""

    async def burst(engine) -> list[Any]:
        with ExitStack() as stack:
            arrivals = [stack.enter_context(engine.arrival()) for _ in range(n)]
            return await asyncio.gather(*(a.submit(item) for a in arrivals))

    async def main(engine) -> Bursts:
        for _ in range(warmups):
            await burst(engine)
        out = Bursts([], [])
        t_start = time.perf_counter()
        while len(out.times) < reps or time.perf_counter() - t_start < min_seconds:
            t = time.perf_counter()
            out.results += await burst(engine)
            out.times.append(time.perf_counter() - t)
        return out

    return with_engine(spec, main, threads)


def with_engine(spec: Any, run, threads: int | None = None, device: Any = None):
    """`asyncio.run(run(engine))` on a fresh pipeline of `spec` set up in this process, on
    `device` (None: the worker's choice, `pick_device`)."""
    import torch

    from services.worker.engine.engine import Engine
    from services.worker.pipelines.factory import build_pipeline
    from services.worker.runtime import pick_device
    from shared.settings import get_settings

    if threads is not None:
        torch.set_num_threads(threads)
    pipeline = build_pipeline(spec, device or pick_device(get_settings()))
    pipeline.setup()

    async def main():
        return await run(Engine(pipeline))

    try:
        return asyncio.run(main())
    finally:
        # The device thread is let go, so that the interpreter can exit.
        pipeline.device_executor.shutdown(wait=True)
