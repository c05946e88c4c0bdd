"""The API's Prometheus metrics (histograms, so they add up across replicas). Jobs reaching a
final status are counted in shared/job_metrics.py, as workers make some of them final."""

from prometheus_client import Counter, Gauge, Histogram

JOBS_SUBMITTED = Counter("fibermill_jobs_submitted", "Jobs accepted", ["task", "model"])
QUEUE_DEPTH = Gauge(
    "fibermill_queue_depth",
    "Sub-requests waiting in a model's queue, by priority list (0 highest): sum over priority "
    "for the model's queue; prefetched and running ones are not in it",
    ["model", "priority"],
)
SUBREQUESTS_BACKLOG = Gauge(
    "fibermill_subrequests_backlog",
    "Sub-requests of a model sent and not finished: queued, prefetched by a worker or running "
    "(what workers are scaled on)",
    ["model"],
)
SUBREQUESTS_RUNNING = Gauge(
    "fibermill_subrequests_running", "Sub-requests that hold a lease on some worker"
)
SUBREQUESTS_RESENT = Counter(
    "fibermill_subrequests_resent",
    "Sub-requests sent again by the janitor, by reason",
    ["reason"],
)
RESEND_REASONS = ("lease_expired", "dispatch_interrupted")
for _reason in RESEND_REASONS:  # exported at 0 from the start, so rate() and alerts see them
    SUBREQUESTS_RESENT.labels(_reason)
DEAD_LETTERED = Counter("fibermill_subrequests_dead_lettered", "Sub-requests given up")

# HTTP, labelled by the matched route's path template (bounded), never by the raw path.
HTTP_REQUESTS = Counter(
    "fibermill_http_requests",
    "HTTP requests answered, by method, route template ('unmatched' when no route) and code",
    ["method", "route", "code"],
)
HTTP_DURATION = Histogram(
    "fibermill_http_request_duration_seconds",
    "HTTP request time until the response ended (for event streams: the stream's life)",
    ["method", "route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
