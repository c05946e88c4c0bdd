"""The blob store's Prometheus metrics, counted by the BlobStore base class so that every
backend counts the same way. They live in the process that uses the store (API or worker) and
are served with its other metrics."""

from prometheus_client import Counter, Histogram

OPERATIONS = ("put", "open", "read", "copy", "delete", "url", "ping", "keys", "folders")

WRITTEN_BYTES = Counter(
    "fibermill_blob_written_bytes", "Bytes written to the blob store", ["backend"]
)
OBJECTS_WRITTEN = Counter(
    "fibermill_blob_objects_written",
    "Objects written to the blob store (writing a key again counts again)",
    ["backend"],
)
OBJECTS_DELETED = Counter(
    "fibermill_blob_objects_deleted",
    "Keys deleted from the blob store (one already missing counts too: S3 does not say)",
    ["backend"],
)
DELETED_BYTES = Counter(
    "fibermill_blob_deleted_bytes",
    "Bytes deleted from the blob store by retention (a folder deleted whole; deleting single "
    "keys does not know their size)",
    ["backend"],
)
READ_BYTES = Counter(
    "fibermill_blob_read_bytes", "Bytes streamed out of the blob store", ["backend"]
)
OPERATION_SECONDS = Histogram(
    "fibermill_blob_operation_duration_seconds",
    "Blob store operation time, retries included (open: until the size and type are known, "
    "not the streaming of the bytes)",
    ["backend", "operation"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
FAILURES = Counter(
    "fibermill_blob_failures",
    "Blob store operations that failed after the client's retries, by operation (read: "
    "while streaming an object's bytes); a missing key is not a failure",
    ["backend", "operation"],
)


def export(backend: str) -> None:
    """Make every series of a backend exist at 0, so rate() and alerts see them from the start."""
    for counter in (WRITTEN_BYTES, OBJECTS_WRITTEN, OBJECTS_DELETED, DELETED_BYTES, READ_BYTES):
        counter.labels(backend)
    for operation in OPERATIONS:
        FAILURES.labels(backend, operation)
