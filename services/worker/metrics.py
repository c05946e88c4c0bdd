"""The worker's own Prometheus metrics, served on FIBERMILL_WORKER_METRICS_PORT + device index."""

from prometheus_client import Counter, Gauge, Histogram

SUBREQUESTS = Counter(
    "fibermill_worker_subrequests",
    "Sub-requests handled by this worker, by outcome",
    ["model", "outcome"],
)
PHASE_SECONDS = Histogram(
    "fibermill_phase_duration_seconds",
    "Time spent in one pipeline phase",
    ["model", "phase"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
MODEL_LOAD_SECONDS = Gauge(
    "fibermill_model_load_seconds", "Time it took to load a model at worker start", ["model"]
)
IN_FLIGHT = Gauge("fibermill_worker_in_flight", "Sub-requests this worker holds right now")
STEPS_AFTER_STOP = Histogram(
    "fibermill_steps_after_stop",
    "Denoise or decode steps a sub-request ran after it was asked to stop (cancel, time limit)",
    ["model"],
    buckets=(0, 1, 2, 3, 5, 10, 20, 50),
)
