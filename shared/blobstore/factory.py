"""The store that the settings name."""

from shared.blobstore.base import BlobStore
from shared.settings import Settings


def open_store(settings: Settings) -> BlobStore:
    """A new store for `settings.blob_backend`: no connection is made until it is used. Make
    one per process and event loop, and close it at shutdown."""
    if settings.blob_backend == "local":
        from shared.blobstore.local import LocalBlobStore

        return LocalBlobStore(settings.blob_dir, ping_timeout=settings.blob_timeout_seconds)
    if settings.blob_backend == "s3":
        # Imported here: aiobotocore is needed only by installations that use S3.
        from shared.blobstore.s3 import S3BlobStore

        secret = settings.s3_secret_access_key
        return S3BlobStore(
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
    raise ValueError(f"unknown blob_backend {settings.blob_backend!r}")
