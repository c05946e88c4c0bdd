"""The worker engine: operators wired by a router, run by a scheduler, fed by a batcher.

A pipeline is a graph of operators (`operator.py`) walked by a router (`router.py`) and run by
`Scheduler.run_async` (`scheduler.py`) on executors, so the event loop never blocks. Per-batch
state (`batch.py`) is kept apart from the read-only pipeline; device buffers come from a
per-device `BufferPool` (`buffers.py`); the host reads device memory only through `sync.py`.
"""
