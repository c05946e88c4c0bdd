"""Model pipelines: load a registry model once per process and run batches of items on it."""
