"""OpenAI's Files and Batch APIs on Fibermill's jobs: files (files.py), the JSONL of a batch's
input (jsonl.py), batches in Redis (store.py) and the loop that runs them as jobs (driver.py).
docs/batch.md says how a batch runs."""
