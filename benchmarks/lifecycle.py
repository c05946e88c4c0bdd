"""Lifecycle figures for `make bench`: how fast a cancel frees the worker, and how soon a
`completed` webhook arrives after the job's final state."""

import statistics
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import redis

from services.devstack.redis_server import free_port
from shared import names


def _stats(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"n": len(xs), "median": statistics.median(xs), "p90": xs[int(0.9 * (len(xs) - 1))],
            "min": xs[0], "max": xs[-1]}


def cancel_to_free(http: httpx.Client, r: redis.Redis, n: int) -> dict:
    """A 50-step digits image is canceled mid-run; time until its worker lets go of it."""
    xs = []
    for _ in range(n):
        job = http.post("/v1/jobs", json={"task": "image-generation", "model": "digits",
                                          "input": {"prompts": ["5"], "steps": 50}}).json()
        deadline = time.monotonic() + 30
        owner = names.job_key(job["id"]), names.owner_field(0)
        while not r.hget(*owner) and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(0.4)  # into the run (about a third of it on a CPU)
        t0 = time.perf_counter()
        http.post(f"/v1/jobs/{job['id']}/cancel")
        while r.hget(*owner):
            time.sleep(0.001)
        xs.append(time.perf_counter() - t0)
    return _stats(xs)


def webhook_latency(http: httpx.Client, n: int) -> dict:
    """From the job's completed_at to the receiver holding the request."""
    arrived: dict[str, float] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["content-length"]))
            arrived[self.headers["webhook-id"]] = time.time()
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    xs = []
    try:
        for _ in range(n):
            job = http.post("/v1/jobs", headers={"Prefer": "wait=30"}, json={
                "task": "text-generation", "model": "tiny-gpt2",
                "input": {"prompts": ["hi"], "max_new_tokens": 4},
                "webhook": f"http://127.0.0.1:{port}/hook"}).json()
            key = f"msg_{job['id']}_completed"
            deadline = time.monotonic() + 10
            while key not in arrived and time.monotonic() < deadline:
                time.sleep(0.001)
            final = http.get(f"/v1/jobs/{job['id']}").json()
            done_at = datetime.fromisoformat(final["completed_at"]).timestamp()
            xs.append(arrived[key] - done_at)
    finally:
        server.shutdown()
        server.server_close()
    return _stats(xs)
