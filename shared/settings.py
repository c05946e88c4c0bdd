"""All of Fibermill's settings, read from `FIBERMILL_*` environment variables."""

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parent.parent


class KeyQuotas(BaseModel):
    """One API key's own quotas (FIBERMILL_KEY_QUOTAS); one left out is the default."""

    model_config = ConfigDict(extra="forbid")
    max_active_batches: int | None = Field(None, ge=1)
    max_stored_file_bytes: int | None = Field(None, ge=1)
    batch_queue_share: float | None = Field(None, gt=0, le=1)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FIBERMILL_", extra="ignore")

    # The Redis: its address, or with Sentinel only its password and database (the primary's
    # address comes from the sentinels).
    redis_url: str = "redis://127.0.0.1:6379/0"
    # How long a Redis command is retried before its caller sees the error (shared/redis_client).
    redis_retry_seconds: float = Field(20.0, ge=0)
    # Redis Sentinel: `host:port,host:port,...` of the sentinels and the name they monitor the
    # primary by; set, every client asks them where the primary is and follows a failover.
    redis_sentinels: str = ""
    redis_sentinel_master: str = "fibermill"
    redis_sentinel_password: SecretStr | None = None  # the sentinels' own (`requirepass`)
    # Replicas that must hold the writes that make a job (its creation, results, final state)
    # before they count as done (Redis WAIT): replication is asynchronous, and a replica
    # promoted by a failover lacks what it was not sent. Unset: 1 with Sentinel, else 0.
    redis_min_replicas: int | None = Field(None, ge=0)
    redis_replica_timeout_ms: int = Field(2000, ge=1)
    model_registry: Path = REPO_ROOT / "models" / "registry.yaml"

    # Jobs
    # How long a finished job's record (status, text outputs, sub-results) stays in Redis.
    finished_job_ttl_seconds: int = Field(24 * 3600, ge=60)
    max_body_bytes: int = Field(1_000_000, ge=1024)

    # Sub-request execution and recovery
    subrequest_time_limit_seconds: int = Field(600, ge=1)
    # Which sub-requests share cached prompt pages (prefix caching): those of one API key
    # (`key`), or all (`global`: one system prompt's pages serve every tenant, and how soon a
    # prompt is answered tells whether another's began alike).
    prefix_cache_scope: Literal["key", "global"] = "key"
    lease_seconds: float = Field(15.0, gt=0)
    heartbeat_seconds: float = Field(3.0, gt=0)
    janitor_interval_seconds: float = Field(2.0, gt=0)
    max_attempts: int = Field(3, ge=1)
    # The sub-requests given up that `fm:deadletter` keeps for an operator, newest first (ids,
    # model, error, attempts and the prompt's length: never the prompt).
    dead_letter_max: int = Field(10_000, ge=1)
    # An outstanding sub-request that no worker leases and no queue holds is sent again after
    # this long (services/api/orphans.py); unset, two lease periods.
    lost_subrequest_seconds: float | None = Field(None, gt=0)

    # Joiner (Redis Streams consumer group on the completion stream)
    joiner_claim_idle_seconds: float = Field(30.0, gt=0)
    joiner_block_ms: int = Field(1000, ge=10)

    # Workers
    cpu_workers: int = Field(1, ge=0)
    # Intra-op threads of each CPU worker; unset, the host's cores are divided among the CPU
    # workers. A small model's ops are too short to split across cores: where the API, Redis
    # or other workers share the cores, one thread does more (docs/architecture.md).
    cpu_threads: int | None = Field(None, ge=1)
    # Sub-requests one worker process holds at once (Celery threads, prefetch 1 each); unset, it
    # is twice the largest max_batch among the models it serves (a batch on the device, the
    # next one filling up), while the rest of the backlog stays in the queue for other workers.
    worker_concurrency: int | None = Field(None, ge=1)
    batching: bool = True  # off: every sub-request runs as a batch of one (benchmarks)
    worker_models: str = ""  # comma-separated; empty serves every model in the registry
    worker_heartbeat_ttl_seconds: float = Field(15.0, gt=0)
    worker_metrics_port: int = 9100
    # The address the worker's /metrics listens on: every interface (Prometheus scrapes the
    # pod); `make run` gives it the API's host.
    worker_metrics_host: str = "0.0.0.0"
    # Where each worker writes the port its /metrics is bound to (`<device index>.port`): a
    # free one when the configured port is taken. `make run` sets it and prints the ports.
    worker_metrics_port_dir: str = ""
    # Graceful drain at SIGTERM: a worker stops taking sub-requests and finishes the ones it
    # holds; past this many seconds it stops them and hands them back to their queue.
    # Size it above the longest sub-request (twice: a worker holds a running batch and the
    # next one), and terminationGracePeriodSeconds above it plus ~15 s (see README).
    drain_seconds: float = Field(20.0, ge=0)
    device: str = ""  # set by the launcher: "cuda" or "cpu"
    # A text model's KV-cache pool (services/worker/engine/kv_budget.py), unless its registry
    # entry says: this many bytes; unset, `gpu_memory_utilization` of the GPU memory left free
    # once its weights are loaded, or 4 GiB on the CPU.
    kv_cache_bytes: int | None = Field(None, ge=1)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    device_index: int = 0
    worker_name: str = ""
    ready_file: str = ""  # set by the launcher: created once this worker's models are loaded

    public_url: str = ""  # base for output URLs; empty gives relative URLs

    # Logs of every process (shared/logs.py): the level, and each line as text or as a JSON
    # object for a collector that parses them.
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    log_format: Literal["text", "json"] = "text"

    # API process (services/api/serve.py): at SIGTERM /readyz answers 503 at once and the
    # API keeps serving this long, so load balancers stop sending before the socket closes.
    api_drain_seconds: float = Field(5.0, ge=0)
    # /readyz needs a live worker; false (scale-to-zero workers, e.g. KEDA minReplicaCount 0)
    # needs only Redis, else no job would ever reach the queue that scales workers up.
    ready_requires_workers: bool = True

    # Access and limits
    api_keys: str = ""  # comma-separated; empty leaves the API open
    rate_limit_per_minute: float = Field(600, gt=0)  # job submissions per key
    rate_limit_burst: int = Field(60, ge=1)
    max_queue_depth: int = Field(10_000, ge=1)  # per model, unless its registry entry says
    max_wait_seconds: int = Field(60, ge=0)  # the most `Prefer: wait=N` may ask for
    # Live event streams and `Prefer: wait` answers one API replica holds at once, in all and
    # per API key (services/api/watchers.py).
    max_watches: int = Field(2000, ge=1)
    max_watches_per_caller: int = Field(200, ge=1)
    max_deadline_seconds: int = Field(7 * 24 * 3600, ge=1)

    # Usage per API key (GET /v1/usage): each UTC day's counters are kept this long.
    usage_retention_days: int = Field(400, ge=1)
    # A queued job's estimated start divides its place in line by its model's throughput,
    # measured over this many recent seconds (sub-requests finished per second).
    throughput_window_seconds: int = Field(120, ge=10, le=900)

    # Webhooks
    # The Standard Webhooks `whsec_` secret that signs webhooks. Unset, every installation makes
    # its own on first start and keeps it in Redis (`fm:webhook_secret`): never a value anyone
    # can read in this source.
    webhook_secret: str | None = None
    webhook_allow_private: bool = False  # allow loopback/private targets (local development)
    webhook_timeout_seconds: float = Field(10.0, gt=0)
    webhook_retry_total_seconds: float = Field(3600.0, gt=0)
    webhook_progress_interval_seconds: float = Field(1.0, ge=0)
    webhook_backoff_base_seconds: float = Field(1.0, gt=0)  # doubles per attempt, full jitter
    webhook_backoff_cap_seconds: float = Field(300.0, gt=0)
    # With API keys, each key has its own signing secrets (POST /v1/webhook-secret/rotate): a
    # rotated-out one keeps signing beside its successor this long, so receivers can switch.
    webhook_secret_overlap_seconds: int = Field(24 * 3600, ge=0)

    # Blob store for outputs and files (shared/blobstore). "local": files under blob_dir (in
    # deploy/k8s a PersistentVolume mounted by the API and every worker); "s3": a bucket on any
    # S3-compatible server (MinIO, Ceph, GCS interoperability, AWS).
    blob_backend: Literal["local", "s3"] = "local"
    blob_dir: Path = REPO_ROOT / "run" / "blobs"
    # S3: the endpoint (empty: AWS's own for s3_region), the bucket (needed with "s3") and the
    # credentials (unset: botocore's own chain: AWS_* variables, profile, pod or instance role).
    s3_endpoint_url: str = ""
    s3_bucket: str = ""
    s3_region: str = "us-east-1"
    s3_access_key_id: str | None = None
    s3_secret_access_key: SecretStr | None = None
    # The endpoint that presigned URLs name, when readers reach the store at another address
    # than the API does (an in-cluster MinIO Service behind an ingress); empty: s3_endpoint_url.
    s3_presign_endpoint_url: str = ""
    s3_create_bucket: bool = False  # create the bucket at first use when missing (MinIO in dev)
    # Each blob store request's connect and read timeout, and its attempts in all (the S3
    # client's standard retry mode, with backoff) before the operation fails with
    # BlobStoreUnavailable. The local store's ping has the same timeout.
    blob_timeout_seconds: float = Field(10.0, gt=0)
    blob_max_attempts: int = Field(3, ge=1)
    # GET of an output answers with a redirect to a presigned URL of the store instead of the
    # bytes (backends that have them: s3), valid this long.
    blob_presigned_redirect: bool = False
    blob_url_expires_seconds: int = Field(900, ge=1, le=7 * 24 * 3600)
    # How long a worker waits out a blob store that is away before it fails the sub-request
    # whose output it holds (the sub-request keeps its lease meanwhile).
    blob_outage_seconds: float = Field(60.0, ge=0)
    # How long outputs stay in the blob store, counted from when their job was made (the
    # sweeper deletes them by the hour: at most an hour more). Outliving the job's record, an
    # output is still served to the key that made it.
    output_ttl_seconds: int = Field(7 * 24 * 3600, ge=3600)
    # How often each API replica looks for expired outputs (any replica may; it is idempotent).
    sweep_interval_seconds: float = Field(300.0, gt=0)

    # OpenAI-compatible endpoints (services/api/openai)
    # How long a synchronous chat, completion or image call waits for its job; past it the
    # answer is a 504 naming the job, which runs on (GET /v1/jobs/{id}).
    openai_wait_seconds: int = Field(600, ge=1)
    # Batch API: input files up to this size; how long files (input, output, error) are kept,
    # counted from their upload or making, swept by the hour like outputs.
    max_file_bytes: int = Field(100_000_000, ge=1024)
    file_ttl_seconds: int = Field(30 * 24 * 3600, ge=3600)
    # A batch keeps at most this many of its lines queued or running at once.
    batch_max_in_flight: int = Field(256, ge=1)
    # Per-key quotas (services/api/quotas.py): batches open at once (validating to finalizing),
    # bytes of files stored (uploads and batch output), and the share of a model's queue limit
    # (max_queue_depth) that one key's batch lines may hold queued or running; past that share
    # its batches wait. FIBERMILL_KEY_QUOTAS overrides them per key id (the first 16 hex digits
    # of the key's SHA-256, as jobs record their owner), as JSON:
    # {"<key id>": {"max_active_batches": 2, "max_stored_file_bytes": 10000000,
    #  "batch_queue_share": 0.05}}.
    max_active_batches_per_key: int = Field(20, ge=1)
    max_stored_file_bytes_per_key: int = Field(10 * 1024**3, ge=1)
    batch_queue_share_per_key: float = Field(0.1, gt=0, le=1)
    key_quotas: dict[str, KeyQuotas] = Field(default_factory=dict)

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_any_case(cls, value: object) -> object:
        # FIBERMILL_LOG_LEVEL=info reads as INFO, as Celery and uvicorn take it.
        return value.upper() if isinstance(value, str) else value

    @field_validator("log_format", mode="before")
    @classmethod
    def _format_any_case(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _heartbeat_within_lease(self) -> "Settings":
        if self.heartbeat_seconds >= self.lease_seconds:
            raise ValueError("heartbeat_seconds must be shorter than lease_seconds")
        return self

    @model_validator(mode="after")
    def _s3_needs_bucket(self) -> "Settings":
        if self.blob_backend == "s3" and not self.s3_bucket:
            raise ValueError("blob_backend s3 needs s3_bucket (FIBERMILL_S3_BUCKET)")
        return self

    @field_validator("redis_sentinels")
    @classmethod
    def _sentinels_are_addresses(cls, value: str) -> str:
        for part in filter(None, (p.strip() for p in value.split(","))):
            host, sep, port = part.rpartition(":")
            if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
                raise ValueError(f"{part!r} is not host:port (FIBERMILL_REDIS_SENTINELS is "
                                 "host:port,host:port,...)")
        return value

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        out = []
        for part in filter(None, (p.strip() for p in self.redis_sentinels.split(","))):
            host, _, port = part.rpartition(":")
            out.append((host.strip("[]"), int(port)))
        return out

    @property
    def replicas_to_wait(self) -> int:
        if self.redis_min_replicas is not None:
            return self.redis_min_replicas
        return 1 if self.sentinel_addresses else 0

    @property
    def lost_after_seconds(self) -> float:
        return self.lost_subrequest_seconds or 2 * self.lease_seconds

    @property
    def api_key_list(self) -> list[str]:
        return [k.strip() for k in self.api_keys.split(",") if k.strip()]

    @property
    def served_models(self) -> list[str]:
        return [m.strip() for m in self.worker_models.split(",") if m.strip()]


@lru_cache
def get_settings() -> Settings:
    return Settings()
