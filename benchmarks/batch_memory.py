"""What one API key's large batches cost the API process's memory: a real local stack (Redis,
the API, one CPU worker serving tiny-gpt2), ten uploads of a 60 MB JSONL batch input (50,000
requests of about 1.2 KB each) each followed by a batch made of it, then every batch cancelled.

    python -m benchmarks.batch_memory [--uploads 10] [--megabytes 60]

It prints the API process's resident memory (psutil) when ready, after each upload and batch
(once the batch is in progress), its peak (sampled every 50 ms) and after the cancels, with the
slowest `/healthz` answer (polled every 50 ms: the event loop's stall) during each upload and
while its batch validates and submits its first lines, and Redis's used_memory.
The batches' lines need not finish: the point is what the API holds while it drives them.
"""

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil
import redis

from benchmarks.stack import bench_stack

MB = 1_000_000


def write_input(path: Path, megabytes: int) -> int:
    """A batch input of about `megabytes` MB in 50,000 requests at most; its request count."""
    per_line = megabytes * MB // 50_000
    n = 0
    with path.open("wb") as f:
        while n < 50_000 and f.tell() < megabytes * MB - per_line:
            body = {"model": "tiny-gpt2", "max_tokens": 2, "prompt": ""}
            request = {"custom_id": f"r{n}", "method": "POST", "url": "/v1/completions",
                       "body": body}
            body["prompt"] = "the " * ((per_line - len(json.dumps(request)) - 1) // 4)
            f.write(json.dumps(request).encode() + b"\n")
            n += 1
    return n


class Sampler:
    """The process's RSS every 50 ms, in a thread, and the slowest /healthz answer."""

    def __init__(self, pid: int, url: str) -> None:
        self.proc = psutil.Process(pid)
        self.url = url
        self.peak = 0
        self.slowest = 0.0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._rss, daemon=True),
                         threading.Thread(target=self._health, daemon=True)]
        for t in self._threads:
            t.start()

    def rss(self) -> int:
        return self.proc.memory_info().rss

    def _rss(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.peak = max(self.peak, self.rss())
            except psutil.NoSuchProcess:
                return

    def _health(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as http:
            while not self._stop.wait(0.05):
                t0 = time.perf_counter()
                http.get("/healthz")
                self.slowest = max(self.slowest, time.perf_counter() - t0)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()


def wait_status(http: httpx.Client, batch_id: str, statuses: set[str], seconds: float) -> str:
    deadline = time.monotonic() + seconds
    while True:
        status = http.get(f"/v1/batches/{batch_id}").json()["status"]
        if status in statuses or time.monotonic() > deadline:
            return status
        time.sleep(0.2)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.batch_memory", description=__doc__)
    ap.add_argument("--uploads", type=int, default=10)
    ap.add_argument("--megabytes", type=int, default=60)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "input.jsonl"
        requests = write_input(path, args.megabytes)
        size = path.stat().st_size
        print(f"input: {size / MB:.1f} MB, {requests} requests")
        env = {"FIBERMILL_BLOB_DIR": str(Path(tmp) / "blobs")}
        with bench_stack(models="tiny-gpt2", env=env, threads=1) as stack:
            http = httpx.Client(base_url=stack.url, timeout=600)
            r = redis.Redis(port=stack.redis_port)
            sampler = Sampler(stack.api.pid, stack.url)
            base = sampler.rss()
            print(f"API RSS when ready: {base / MB:.0f} MB")
            batches, after = [], []
            for k in range(args.uploads):
                sampler.slowest = 0.0
                t0 = time.perf_counter()
                with path.open("rb") as f:
                    resp = http.post("/v1/files", files={"file": ("in.jsonl", f)},
                                     data={"purpose": "batch"})
                if resp.status_code != 200:
                    raise SystemExit(f"upload {k + 1}: {resp.status_code} {resp.text[:500]}")
                took = time.perf_counter() - t0
                upload_stall, sampler.slowest = sampler.slowest, 0.0
                batch = http.post("/v1/batches", json={
                    "input_file_id": resp.json()["id"], "endpoint": "/v1/completions",
                    "completion_window": "24h"}).json()
                batches.append(batch["id"])
                status = wait_status(http, batch["id"], {"in_progress", "failed"}, 300)
                start_stall = sampler.slowest  # validating, and its first lines submitted
                after.append(sampler.rss())
                print(f"upload {k + 1}: {took:.1f} s, slowest /healthz meanwhile "
                      f"{upload_stall * 1000:.0f} ms; batch {status} (slowest /healthz "
                      f"{start_stall * 1000:.0f} ms); API RSS {after[-1] / MB:.0f} MB "
                      f"(peak so far {sampler.peak / MB:.0f} MB)")
            for batch_id in batches:
                http.post(f"/v1/batches/{batch_id}/cancel")
            ended = [wait_status(http, b, {"cancelled", "failed", "completed"}, 600)
                     for b in batches]
            time.sleep(2)
            final = sampler.rss()
            used = r.info("memory")["used_memory"]
            sampler.stop()
            print(f"cancelled: {ended.count('cancelled')} of {len(batches)}; API RSS "
                  f"{final / MB:.0f} MB; Redis used_memory {used / MB:.1f} MB")
            print(f"API RSS: ready {base / MB:.0f} MB, after the uploads "
                  f"{min(after) / MB:.0f}..{max(after) / MB:.0f} MB "
                  f"(median {statistics.median(after) / MB:.0f}), peak {sampler.peak / MB:.0f}"
                  f" MB, after the cancels {final / MB:.0f} MB; spread after the uploads "
                  f"{(max(after) - min(after)) / MB:.0f} MB")


if __name__ == "__main__":
    main()
