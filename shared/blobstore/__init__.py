"""Outputs and files in a blob store, not in Redis: one small async interface (BlobStore: put,
open to stream, delete, url, ping, keys, close) over a local folder or an S3-compatible bucket,
picked by the settings (open_store). Keys: keys.py; metrics: metrics.py."""

from shared.blobstore.base import BlobStore, content_type_of
from shared.blobstore.blob import Blob
from shared.blobstore.factory import open_store
from shared.blobstore.keys import check_key, check_prefix, hour_of, hour_prefix, output_key

__all__ = [
    "Blob",
    "BlobStore",
    "check_key",
    "check_prefix",
    "content_type_of",
    "hour_of",
    "hour_prefix",
    "open_store",
    "output_key",
]
