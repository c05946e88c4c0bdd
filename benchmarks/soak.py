"""A steady-load soak of a local stack: what Redis holds per finished job, how long an output
fetch takes from each blob store backend, and what a blob store outage mid-load costs.

    python -m benchmarks.soak --minutes 10 --rate 28
    python -m benchmarks.soak --minutes 3 --backend s3 --outage-at 60 --outage-for 30

One API, one CPU worker, its own Redis; half the jobs are 2-prompt tiny-gpt2 texts, half
2-prompt 16x16 digits images. Every accepted job is followed to a final state and counted
(succeeded, failed, lost, wrong output: an image output that is not a PNG). Redis's
`used_memory` is read after a warm-up and at the end of the load; its growth over the jobs
that finished in between is what a finished job costs Redis for as long as its record lives.
The outage: S3 (moto's server) is frozen with SIGSTOP, so connections hang as with a store
that is unreachable; the local store's folder is swapped for a file, so every write fails.
"""

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from services.devstack.processes import start_api, start_workers, stop, wait_ready
from services.devstack.redis_server import free_port, start_redis
from services.devstack.s3_server import S3Server

WARMUP_SECONDS = 60.0
DRAIN_SECONDS = 180.0
S3_KEYS = {"FIBERMILL_S3_ACCESS_KEY_ID": "soak", "FIBERMILL_S3_SECRET_ACCESS_KEY": "soak-secret"}
TEXT = {"model": "tiny-gpt2", "input": {"prompts": ["The queue", "A worker"],
                                        "max_new_tokens": 8}}
IMAGE = {"model": "digits", "input": {"prompts": ["3", "8"], "steps": 10}}


@dataclass
class Tally:
    accepted: int = 0
    rejected: int = 0
    final: dict[str, int] = field(default_factory=dict)
    ids: list[tuple[str, str]] = field(default_factory=list)  # (id, model)
    lost: int = 0
    retried: int = 0  # requests sent again after a connection error


async def _retried(send: Callable[[], Awaitable[httpx.Response]], tally: Tally
                  ) -> httpx.Response:
    """A request again after a connection error (a keep-alive connection the server closed as
    it was reused): safe, since a job is submitted with an Idempotency-Key."""
    for attempt in range(10):
        try:
            return await send()
        except httpx.TransportError:
            tally.retried += 1
            if attempt == 9:
                raise
            await asyncio.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


async def _follow(client: httpx.AsyncClient, body: dict, tally: Tally) -> None:
    headers = {"Prefer": "wait=60", "Idempotency-Key": uuid.uuid4().hex}
    resp = await _retried(lambda: client.post("/v1/jobs", json=body, headers=headers), tally)
    if resp.status_code not in (200, 202):
        tally.rejected += 1
        return
    tally.accepted += 1
    job = resp.json()
    deadline = time.monotonic() + DRAIN_SECONDS
    while job["status"] not in ("succeeded", "failed", "canceled"):
        if time.monotonic() > deadline:
            tally.lost += 1
            return
        await asyncio.sleep(0.5)
        path = f"/v1/jobs/{job['id']}"
        job = (await _retried(lambda: client.get(path), tally)).json()  # noqa: B023
    tally.final[job["status"]] = tally.final.get(job["status"], 0) + 1
    tally.ids.append((job["id"], body["model"]))


async def _load(url: str, seconds: float, rate: float, tally: Tally) -> None:
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        tasks: set[asyncio.Task] = set()
        start = time.monotonic()
        n = 0
        while (now := time.monotonic()) - start < seconds:
            due = start + n / rate
            if due > now:
                await asyncio.sleep(due - now)
            body = TEXT if n % 2 == 0 else IMAGE
            task = asyncio.create_task(_follow(client, body, tally))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            n += 1
        await asyncio.gather(*tasks)


async def _check_outputs(url: str, ids: list[tuple[str, str]]) -> tuple[int, list[float]]:
    """Wrong image outputs among all jobs, and the fetch time of each image output (s)."""
    wrong, times = 0, []
    async with httpx.AsyncClient(base_url=url, timeout=30, follow_redirects=True) as client:
        for job_id, model in ids:
            if model != IMAGE["model"]:
                continue
            for i in range(2):
                t0 = time.perf_counter()
                resp = await client.get(f"/v1/jobs/{job_id}/outputs/{i}")
                times.append(time.perf_counter() - t0)
                if resp.status_code != 200 or not resp.content.startswith(b"\x89PNG"):
                    wrong += 1
    return wrong, times


def _memory_by_key_kind(r: redis.Redis) -> dict[str, dict[str, int]]:
    """MEMORY USAGE summed over keys of the same shape (ids replaced by `{id}`)."""
    kinds: dict[str, dict[str, int]] = {}
    keys = list(r.scan_iter(count=1000))
    for start in range(0, len(keys), 1000):
        chunk = keys[start:start + 1000]
        pipe = r.pipeline(transaction=False)
        for key in chunk:
            pipe.memory_usage(key, samples=0)
        for key, size in zip(chunk, pipe.execute(), strict=True):
            kind = re.sub(rb"[0-9a-f]{32}", b"{id}", key).decode(errors="replace")
            entry = kinds.setdefault(kind, {"keys": 0, "bytes": 0})
            entry["keys"] += 1
            entry["bytes"] += size or 0
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]["bytes"])[:12])


class Outage:
    def __init__(self, backend: str, s3: subprocess.Popen | None, blob_dir: Path) -> None:
        self.backend, self.s3, self.blob_dir = backend, s3, blob_dir

    def begin(self) -> None:
        if self.s3 is not None:
            self.s3.send_signal(signal.SIGSTOP)
        else:
            self.blob_dir.rename(self.blob_dir.with_name("blobs.away"))
            self.blob_dir.write_text("the volume is gone")

    def end(self) -> None:
        if self.s3 is not None:
            self.s3.send_signal(signal.SIGCONT)
        else:
            self.blob_dir.unlink()
            self.blob_dir.with_name("blobs.away").rename(self.blob_dir)


async def _soak(url: str, r: redis.Redis, args: argparse.Namespace, outage: Outage) -> dict:
    tally = Tally()
    load = asyncio.create_task(_load(url, args.minutes * 60, args.rate, tally))
    await asyncio.sleep(WARMUP_SECONDS)
    mem0, done0, t0 = r.info("memory")["used_memory"], sum(tally.final.values()), time.time()
    if args.outage_at is not None:
        await asyncio.sleep(max(0.0, args.outage_at - WARMUP_SECONDS))
        outage.begin()
        await asyncio.sleep(args.outage_for)
        outage.end()
    while not load.done() and time.time() - t0 < args.minutes * 60 - WARMUP_SECONDS:
        await asyncio.sleep(1)
    mem1, done1, t1 = r.info("memory")["used_memory"], sum(tally.final.values()), time.time()
    await load
    by_kind = _memory_by_key_kind(r)
    wrong, fetch = await _check_outputs(url, tally.ids)
    fetch.sort()
    return {
        "accepted": tally.accepted, "rejected": tally.rejected, "final": tally.final,
        "lost": tally.lost, "wrong_output": wrong, "requests_retried": tally.retried,
        "jobs_per_s": round((done1 - done0) / (t1 - t0), 1),
        "redis_used_memory_growth_bytes": mem1 - mem0,
        "redis_bytes_per_finished_job": round((mem1 - mem0) / max(1, done1 - done0)),
        "redis_used_memory_end": mem1,
        "redis_bytes_by_key_kind": by_kind,
        "output_fetches": len(fetch),
        "output_fetch_ms_p50": round(1000 * statistics.median(fetch), 2) if fetch else None,
        "output_fetch_ms_p95": round(1000 * fetch[int(0.95 * (len(fetch) - 1))], 2)
        if fetch else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--rate", type=float, default=28.0, help="jobs submitted per second")
    p.add_argument("--backend", choices=("local", "s3"), default="local")
    p.add_argument("--outage-at", type=float, help="seconds into the load")
    p.add_argument("--outage-for", type=float, default=30.0)
    p.add_argument("--registry", default="models/registry.yaml")
    args = p.parse_args()

    work = Path(tempfile.mkdtemp(prefix="fibermill-soak-"))
    blob_dir = work / "blobs"
    redis_port, api_port = free_port(), free_port()
    env = {"FIBERMILL_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
           "FIBERMILL_MODEL_REGISTRY": str(Path(args.registry).absolute()),
           "FIBERMILL_CPU_WORKERS": "1", "FIBERMILL_BLOB_DIR": str(blob_dir),
           "FIBERMILL_RATE_LIMIT_PER_MINUTE": "1000000", "FIBERMILL_RATE_LIMIT_BURST": "100000",
           "FIBERMILL_LOG_LEVEL": "WARNING"}
    procs: list[subprocess.Popen] = []
    s3 = None
    if args.backend == "s3":
        server = S3Server()
        server.start()
        s3 = server.proc
        env |= {"FIBERMILL_BLOB_BACKEND": "s3", "FIBERMILL_S3_BUCKET": "soak",
                "FIBERMILL_S3_ENDPOINT_URL": server.url,
                "FIBERMILL_S3_CREATE_BUCKET": "true", **S3_KEYS}
    redis_proc = start_redis(redis_port, work / "redis", appendonly=False)
    logs = open(work / "stack.log", "w")  # noqa: SIM115 - closed below
    try:
        procs.append(start_workers(env, stdout=logs, stderr=logs))
        procs.insert(0, start_api(api_port, env, stdout=logs, stderr=logs))
        url = f"http://127.0.0.1:{api_port}"
        wait_ready(url, timeout=240, procs=procs)
        r = redis.Redis(port=redis_port)
        report = asyncio.run(_soak(url, r, args, Outage(args.backend, s3, blob_dir)))
        report |= {"backend": args.backend, "minutes": args.minutes, "rate": args.rate,
                   "outage_seconds": args.outage_for if args.outage_at is not None else 0}
        print(json.dumps(report, indent=1))
    finally:
        stop(procs)
        if s3 is not None:
            s3.send_signal(signal.SIGCONT)
            s3.kill()
        redis_proc.kill()
        logs.close()
        print(f"logs: {work / 'stack.log'}", file=sys.stderr)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    # A soak stopped with SIGTERM still stops the stack it started (the finally in main).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
