"""Outputs and files in a blob store, not in Redis: one small async interface (BlobStore in
base.py: put, open to stream, delete, url, ping, keys, close; Blob in blob.py) over a local
folder (local.py) or an S3-compatible bucket (s3.py, s3_config.py), picked by the settings
(factory.open_store). Keys: keys.py; metrics: metrics.py.

Import from the modules themselves: this package re-exports nothing, so that none of its
modules imports it back."""
