"""The Lua scripts that make each job-store, webhook-outbox, batch and Idempotency-Key change
one atomic step in Redis, and a typed Python wrapper for each.

Each script is a file of its own (scripts/*.lua) with a KEYS/ARGV header; the functions several
scripts share are fragments (fragments/*.lua), composed in where a script names them with a
`--@include <fragment>` line. `loader` reads each once per process and registers it once per
Redis client. Callers use the wrappers (jobs, leases, backlog, queue, webhooks, batches,
claims), which take named, typed arguments and return typed results; none builds KEYS/ARGV by
position.

A job becomes final in one place, the fragment finish_job.lua: finalize.lua and, for a job of
one sub-request, store_result.lua go through it.
"""
