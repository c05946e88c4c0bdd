"""In-process measurements, each in a fresh interpreter of its own."""

import concurrent.futures
import multiprocessing


def isolated(measure, *args):
    """Run `measure(*args)` in a fresh interpreter and return its result. In one process, each
    thread that has run torch keeps its own OpenMP team, spinning for a while after its last
    op: a contender measured on another thread after `generate` (the engine runs on its
    device thread) loses up to a third of its speed to the first one's idle team."""
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        return pool.submit(measure, *args).result()
