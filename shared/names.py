"""Names shared by the API and the workers: Redis keys, Celery queues and tasks, the stream."""

PREFIX = "fm"

RUN_SUBREQUEST_TASK = "fibermill.run_subrequest"
COMPLETIONS_STREAM = f"{PREFIX}:completions"
JOINER_GROUP = "joiners"
LEASES = f"{PREFIX}:leases"
LEASE_OWNERS = f"{PREFIX}:lease_owners"
DEAD_LETTER = f"{PREFIX}:deadletter"
DISPATCHING = f"{PREFIX}:dispatching"
WORKER_PREFIX = f"{PREFIX}:worker:"


def queue_for(model: str) -> str:
    """Each model has its own Celery queue, so workers subscribe to what they have loaded."""
    return f"fibermill.{model}"


def job_key(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}"


def results_key(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}:results"


def blobs_key(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}:blobs"


def attempts_key(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}:attempts"


def worker_key(name: str) -> str:
    return f"{WORKER_PREFIX}{name}"
