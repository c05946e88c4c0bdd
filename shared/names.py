"""Names shared by the API and the workers: Redis keys, Celery queues and tasks, the stream."""

PREFIX = "fm"

RUN_SUBREQUEST_TASK = "fibermill.run_subrequest"
COMPLETIONS_STREAM = f"{PREFIX}:completions"
JOINER_GROUP = "joiners"
LEASES = f"{PREFIX}:leases"
DEAD_LETTER = f"{PREFIX}:deadletter"
DISPATCHING = f"{PREFIX}:dispatching"
DEADLINES = f"{PREFIX}:deadlines"
CANCEL_CHANNEL = f"{PREFIX}:cancel"  # pub/sub: job ids whose running sub-requests must stop
# pub/sub: the id of every job that just became final, published in the same step (finish_job.lua).
# Every API replica listens on one connection (services/api/events.py) and wakes its waiters.
FINAL_CHANNEL = f"{PREFIX}:final"
# pub/sub: the id of a job a live event stream began to watch; workers then publish its step and
# output events (nobody hears them otherwise, so they are not made).
WATCH_CHANNEL = f"{PREFIX}:watch"
WORKER_PREFIX = f"{PREFIX}:worker:"
WEBHOOK_SECRET = f"{PREFIX}:webhook_secret"  # this installation's generated signing secret


def queue_for(model: str) -> str:
    """Each model has its own Celery queue, so workers subscribe to what they have loaded."""
    return f"fibermill.{model}"


def backlog_key(model: str) -> str:
    """A model's outstanding sub-requests ("jobid:index" -> time stored): queued, prefetched
    or running, not yet finished. Its ZCARD is the backlog the workers are scaled on."""
    return f"{PREFIX}:backlog:{model}"


def job_key(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}"


def results_key(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}:results"


def attempts_key(job_id: str) -> str:
    """Where a job stored by an older API kept its sub-requests' attempts; now they are its
    record's `attempts_field`s. Read by nothing any more; given a TTL when such a job ends."""
    return f"{PREFIX}:job:{job_id}:attempts"


OWNER_FIELD = "owner:"
ATTEMPTS_FIELD = "attempts:"


def owner_field(index: int | str) -> str:
    """The field of a job's record naming the holder of its sub-request's lease."""
    return f"{OWNER_FIELD}{index}"


def attempts_field(index: int | str) -> str:
    """The field of a job's record counting its sub-request's attempts (starts on a device)."""
    return f"{ATTEMPTS_FIELD}{index}"


LEASED_FIELD = "leased:"
RAN_FIELD = "ran:"


def leased_field(index: int | str) -> str:
    """The field of a job's record holding when its sub-request's lease was last taken
    (acquire_lease.lua, the Redis server's clock), for the job's timeline."""
    return f"{LEASED_FIELD}{index}"


def ran_field(index: int | str) -> str:
    """The field of a job's record saying how its sub-request ran, as its result was stored
    (store_result.lua): 'started finished worker' (the worker's clock), for the timeline."""
    return f"{RAN_FIELD}{index}"


def split_member(member: str) -> tuple[str, str]:
    """A sub-request's member ("jobid:index"): its job id and its index."""
    job_id, _, index = member.rpartition(":")
    return job_id, index


def webhooks_key(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}:webhooks"


def events_channel(job_id: str) -> str:
    """Pub/sub channel of one job's live events (status, progress, denoise steps)."""
    return f"{PREFIX}:events:{job_id}"


def jobs_index_key(owner: str | None) -> str:
    """Recent jobs of one API key (or of the open API), newest last."""
    return f"{PREFIX}:jobs:{owner or '_open'}"


def worker_key(name: str) -> str:
    return f"{WORKER_PREFIX}{name}"


# Webhook outbox (services/api/webhooks/outbox.py).
WEBHOOKS_DUE_COMPLETED = f"{PREFIX}:webhooks:due:completed"  # ZSET: delivery id -> due time
WEBHOOKS_DUE_UPDATES = f"{PREFIX}:webhooks:due:updates"  # the same for start and progress


def webhook_delivery_key(webhook_id: str) -> str:
    """One pending (or, as a tombstone, settled) webhook delivery."""
    return f"{PREFIX}:webhooks:delivery:{webhook_id}"


def webhook_throttle_key(job_id: str) -> str:
    """Set while a job's progress webhooks are throttled."""
    return f"{PREFIX}:webhooks:throttle:{job_id}"


def webhook_secrets_key(owner: str) -> str:
    """One API key's webhook signing secrets (zset: secret -> when it stops signing, in
    seconds by Redis's clock; +inf for the current one)."""
    return f"{PREFIX}:webhook_secrets:{owner}"


def ratelimit_key(who: str) -> str:
    """One caller's job-submission token bucket ("key:<id>", "ip:<addr>" or "anonymous"): a
    string "tokens time". (Older APIs kept a hash under `fm:ratelimit:<who>`.)"""
    return f"{PREFIX}:bucket:{who}"


# OpenAI Files and Batch API (services/api/batches/).
def file_key(file_id: str) -> str:
    """One file's metadata (hash, TTL = file_ttl_seconds); its bytes are in the blob store."""
    return f"{PREFIX}:file:{file_id}"


def files_index_key(owner: str | None) -> str:
    """One API key's files (zset, every score 0: ids sort by time, listed by lex range)."""
    return f"{PREFIX}:files:{owner or '_open'}"


def batch_key(batch_id: str) -> str:
    """One batch: its OpenAI object's fields, plus what the driver needs (hash)."""
    return f"{PREFIX}:batch:{batch_id}"


def batches_index_key(owner: str | None) -> str:
    """One API key's batches (zset, every score 0, like files_index_key)."""
    return f"{PREFIX}:batches:{owner or '_open'}"


BATCHES_ACTIVE = f"{PREFIX}:batches:active"  # set: batches a driver must still move on


# Per-key quotas (services/api/quotas.py).
def batch_work_key(owner: str | None, model: str) -> str:
    """One key's batch lines outstanding on one model (zset "<sub-requests>:<job id>" -> ms
    reserved at)."""
    return f"{PREFIX}:quota:{owner or '_open'}:batchwork:{model}"


def batch_work_total_key(owner: str | None, model: str) -> str:
    """The sub-requests of batch_work_key's members, summed (string)."""
    return f"{PREFIX}:quota:{owner or '_open'}:batchwork:{model}:total"


def quota_lock_key(owner: str | None, quota: str) -> str:
    """Held (SET NX PX) while one request of the key counts a quota and acts on it."""
    return f"{PREFIX}:quota:{owner or '_open'}:lock:{quota}"


def batch_lease_key(batch_id: str) -> str:
    """Which API replica drives the batch (string, PX lease renewed while it drives)."""
    return f"{PREFIX}:batch:{batch_id}:lease"


def batch_jobs_key(batch_id: str) -> str:
    """A batch's lines submitted and not yet done: line index -> job id (hash)."""
    return f"{PREFIX}:batch:{batch_id}:jobs"


def batch_done_key(batch_id: str) -> str:
    """A batch's finished lines: bit i set once line index i is done (a bitmap)."""
    return f"{PREFIX}:batch:{batch_id}:done"


def batch_lines_key(batch_id: str) -> str:
    """A batch's finished lines not yet written to a part in the blob store: line index ->
    "o" or "e" + the output or error file's line (hash)."""
    return f"{PREFIX}:batch:{batch_id}:lines"


def batch_parts_key(batch_id: str) -> str:
    """The blob keys of a batch's parts: its finished lines, written out a part at a time
    (list)."""
    return f"{PREFIX}:batch:{batch_id}:parts"
