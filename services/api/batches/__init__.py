"""OpenAI's Files and Batch APIs on Fibermill's jobs: files (files.py), the JSONL of a batch's
input (jsonl.py, checked a chunk at a time by checker.py, read by the driver a window at a
time by batch_input.py), batches in Redis (store.py), their finished lines in the blob store
(parts.py) and the loop that runs them as jobs (driver.py). docs/batch.md says how a batch
runs."""
