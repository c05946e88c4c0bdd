"""The worker's own Prometheus metrics, served on FIBERMILL_WORKER_METRICS_PORT + device index
(metrics_server.py), beside the device memory gauges read at scrape time (device_metrics.py)."""

from prometheus_client import Counter, Gauge, Histogram

SUBREQUESTS = Counter(
    "fibermill_worker_subrequests",
    "Sub-requests handled by this worker, by outcome (succeeded, failed, time_limit, canceled, "
    "handed_back at a drain deadline, duplicate, or the lease outcome that skipped it)",
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
    "Denoise or decode steps a sub-request ran after it was asked to stop (cancel, time limit, "
    "drain)",
    ["model"],
    buckets=(0, 1, 2, 3, 5, 10, 20, 50),
)
BATCH_SIZE = Histogram(
    "fibermill_batch_size",
    "Sub-requests run together in one batch",
    ["model"],
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64),
)
BUFFER_LEASES = Counter(
    "fibermill_buffer_leases",
    "Buffer-set leases, from the preallocated pool or allocated for one batch (adhoc)",
    ["model", "outcome"],
)
BUFFER_FREE_SETS = Gauge(
    "fibermill_buffer_free_sets", "Preallocated buffer sets not leased right now", ["model"]
)
BUFFER_ADHOC_LIVE = Gauge(
    "fibermill_buffer_adhoc_live", "Buffer sets allocated ad hoc and still in use", ["model"]
)
DEVICE_SYNCS = Counter(
    "fibermill_device_syncs",
    "Times the host waited for the device (output: final copy of results; poll: early exit)",
    ["model", "reason"],
)
BATCHES_ISOLATED = Counter(
    "fibermill_batches_isolated",
    "Batches (or text decoder iterations) that failed and were re-run item by item, so that only "
    "the items that fail alone fail",
    ["model"],
)
BATCHES_STOPPED = Counter(
    "fibermill_batches_stopped",
    "Batches that ended early because every item in them was asked to stop (canceled, past "
    "its time limit, a drain): not failures, and not run again",
    ["model"],
)
KV_PAGES_TOTAL = Gauge(
    "fibermill_kv_cache_pages", "KV-cache pages in a text model's pool (engine/text_cache.py)",
    ["model"],
)
KV_PAGES_USED = Gauge(
    "fibermill_kv_cache_pages_used", "KV-cache pages held by running rows right now", ["model"]
)
KV_TOKENS = Gauge(
    "fibermill_kv_cache_tokens",
    "Tokens the running rows hold in their KV-cache pages: over 16 x pages used, how full the "
    "pages are",
    ["model"],
)
KV_ROWS_WAITING = Gauge(
    "fibermill_kv_cache_rows_waiting",
    "Text rows a free row slot was there for that wait for KV-cache pages",
    ["model"],
)
KV_PREFIX_LOOKUP_TOKENS = Counter(
    "fibermill_kv_prefix_lookup_tokens",
    "Prompt tokens in full KV-cache pages looked up in the prefix cache at admission",
    ["model"],
)
KV_PREFIX_HIT_TOKENS = Counter(
    "fibermill_kv_prefix_hit_tokens",
    "Prompt tokens whose keys and values came from cached pages, not recomputed: over the "
    "lookups, the prefix cache's hit rate",
    ["model"],
)
KV_PREFIX_CACHED = Gauge(
    "fibermill_kv_prefix_cached_pages",
    "KV-cache pages known by their content (held by rows or kept for reuse)",
    ["model"],
)
KV_PREFIX_EVICTIONS = Counter(
    "fibermill_kv_prefix_evictions",
    "Cached KV-cache pages no row held that were taken for other contents, least recently used "
    "first",
    ["model"],
)
KV_PREEMPTIONS = Counter(
    "fibermill_kv_cache_preemptions",
    "Running text rows that gave their KV-cache pages back for an older row to grow, to be "
    "recomputed from their tokens later",
    ["model"],
)
