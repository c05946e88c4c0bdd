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
        from shared.blobstore.s3_config import S3Config

        return S3BlobStore(S3Config.from_settings(settings))
    raise ValueError(f"unknown blob_backend {settings.blob_backend!r}")
