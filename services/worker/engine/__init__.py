"""The worker engine: what schedules a model's items onto its device, and the pieces pipelines
build their model code from.

An `Engine` (`engine.py`) feeds one `Scheduling` (`scheduling.py`), built for what the pipeline
offers (`model_code.py`, `factory.py`): a dynamic `Batcher` over a `GraphRunner` for operator
graphs (images), or a continuous `Decoder` for step models (text). A graph of operators
(`operator.py`) walked by a router (`router.py`) is run by `Scheduler.run_async`
(`scheduler.py`) on executors, so the event loop never blocks. Per-batch state (`batch.py`) is
kept apart from the read-only pipeline; device buffers come from a per-device `BufferPool`
(`buffers.py`); the host reads device memory only through `sync.py`.
"""
