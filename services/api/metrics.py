"""The API's Prometheus metrics (histograms, so they add up across replicas)."""

from prometheus_client import Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)

JOBS_SUBMITTED = Counter("fibermill_jobs_submitted", "Jobs accepted", ["task", "model"])
JOBS_FINISHED = Counter(
    "fibermill_jobs_finished", "Jobs that reached a final status", ["task", "model", "status"]
)
JOB_DURATION = Histogram(
    "fibermill_job_duration_seconds",
    "Job time from submit to final status",
    ["task", "model"],
    buckets=LATENCY_BUCKETS,
)
JOB_QUEUE = Histogram(
    "fibermill_job_queue_seconds",
    "Job time from submit to its first sub-request starting",
    ["task", "model"],
    buckets=LATENCY_BUCKETS,
)
JOB_RUN = Histogram(
    "fibermill_job_run_seconds",
    "Job time from its first sub-request starting to final status",
    ["task", "model"],
    buckets=LATENCY_BUCKETS,
)
QUEUE_DEPTH = Gauge("fibermill_queue_depth", "Sub-requests waiting in a model's queue", ["model"])
SUBREQUESTS_RUNNING = Gauge(
    "fibermill_subrequests_running", "Sub-requests that hold a lease on some worker"
)
SUBREQUESTS_RESENT = Counter(
    "fibermill_subrequests_resent",
    "Sub-requests sent again by the janitor, by reason",
    ["reason"],
)
DEAD_LETTERED = Counter("fibermill_subrequests_dead_lettered", "Sub-requests given up")
