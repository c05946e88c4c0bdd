"""What an S3 blob store connects to and how hard it tries (S3Config), built from the settings
(from_settings) or by a test with its own server and short timeouts."""

from dataclasses import dataclass, field

from shared.blobstore.blob import CHUNK_SIZE
from shared.settings import Settings

# Connections one store keeps to the server. An opened Blob holds one until it is read to the
# end or closed, and a further request waits for a free one with no timeout.
MAX_CONNECTIONS = 64
# The slowest upload a put is allowed before it is given up (S3BlobStore._put).
MIN_UPLOAD_BYTES_PER_SECOND = 1024 * 1024


@dataclass(frozen=True)
class S3Config:
    bucket: str
    endpoint_url: str | None = None  # None: AWS's own endpoint for `region`
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    presign_endpoint_url: str | None = None  # None: endpoint_url
    create_bucket: bool = False
    timeout: float = 10.0  # connect and read, per attempt
    max_attempts: int = 3
    chunk_size: int = CHUNK_SIZE
    max_connections: int = MAX_CONNECTIONS
    min_upload_bytes_per_second: float = MIN_UPLOAD_BYTES_PER_SECOND

    @classmethod
    def from_settings(cls, settings: Settings) -> "S3Config":
        secret = settings.s3_secret_access_key
        return cls(
            bucket=settings.s3_bucket,
            endpoint_url=settings.s3_endpoint_url or None,
            region=settings.s3_region,
            access_key_id=settings.s3_access_key_id,
            secret_access_key=secret.get_secret_value() if secret else None,
            presign_endpoint_url=settings.s3_presign_endpoint_url or None,
            create_bucket=settings.s3_create_bucket,
            timeout=settings.blob_timeout_seconds,
            max_attempts=settings.blob_max_attempts,
        )
