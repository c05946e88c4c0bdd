"""Output fetch latency for `make bench`, from each blob store backend.

    .venv/bin/python -m benchmarks.outputs -n 30

For each backend a stack of its own (Redis, API, one CPU worker serving tiny-sd), n one-image
jobs (256x256, one step, so the PNG is as large as the model allows), then each output fetched
once with GET /v1/jobs/{id}/outputs/0 (after one warm-up fetch), measured from the request to
the last byte:

- local: a folder the API and the worker share (a PersistentVolume in deploy/k8s);
- s3: moto's S3 server on a free port, the API streaming the object through;
- s3, presigned redirect (FIBERMILL_BLOB_PRESIGNED_REDIRECT): the API answers 307 and the
  client follows the URL to the store itself.
"""

import argparse
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import httpx

from benchmarks.stack import bench_stack
from services.devstack.s3_server import S3Server

BACKENDS = {
    "local (shared folder), streamed by the API": {},
    "S3 (moto server), streamed by the API": {"s3": True},
    "S3 (moto server), 307 to a presigned URL": {"s3": True, "redirect": True},
}
IMAGE = {"task": "image-generation", "model": "tiny-sd",
         "input": {"prompts": ["a red fox"], "width": 256, "height": 256, "steps": 1, "seed": 3}}


@contextmanager
def _s3() -> Iterator[str]:
    server = S3Server()
    server.start()
    try:
        yield server.url
    finally:
        server.kill()


def _stack(tmp: Path, s3_url: str | None, redirect: bool):
    env = {"FIBERMILL_BLOB_DIR": str(tmp / "blobs")}
    if s3_url:
        env |= {"FIBERMILL_BLOB_BACKEND": "s3", "FIBERMILL_S3_ENDPOINT_URL": s3_url,
                "FIBERMILL_S3_BUCKET": "bench", "FIBERMILL_S3_CREATE_BUCKET": "true",
                "FIBERMILL_S3_ACCESS_KEY_ID": "bench", "FIBERMILL_S3_SECRET_ACCESS_KEY": "bench",
                "FIBERMILL_BLOB_PRESIGNED_REDIRECT": "true" if redirect else "false"}
    return bench_stack("tiny-sd", env=env)


def _fetch_times(base: str, n: int) -> dict:
    with httpx.Client(base_url=base, timeout=60, follow_redirects=True) as http:
        ids = []
        for _ in range(n):
            r = http.post("/v1/jobs", json=IMAGE, headers={"Prefer": "wait=60"})
            job = r.json()
            assert job["status"] == "succeeded", job
            ids.append(job["id"])
        http.get(f"/v1/jobs/{ids[0]}/outputs/0").raise_for_status()  # warm-up
        xs, sizes, hops = [], [], []
        for job_id in ids:
            t0 = time.perf_counter()
            r = http.get(f"/v1/jobs/{job_id}/outputs/0")
            xs.append(time.perf_counter() - t0)
            r.raise_for_status()
            assert r.content[:8] == b"\x89PNG\r\n\x1a\n"
            sizes.append(len(r.content))
            hops.append(len(r.history))
    xs.sort()
    return {"n": n, "median": statistics.median(xs), "p90": xs[int(0.9 * (n - 1))],
            "bytes": statistics.median(sizes), "redirects": max(hops)}


def run(n: int = 30) -> dict[str, dict]:
    out = {}
    for name, how in BACKENDS.items():
        with (tempfile.TemporaryDirectory() as tmp,
              _s3() if how.get("s3") else nullcontext(None) as s3,
              _stack(Path(tmp), s3, how.get("redirect", False)) as stack):
            out[name] = _fetch_times(stack.url, n)
    return out


def report(rows: dict[str, dict]) -> list[str]:
    lines = ["Output fetch, GET /v1/jobs/{id}/outputs/0 of a 256x256 PNG, request to last byte "
             "(each output fetched once, after one warm-up fetch; one stack per backend):", "",
             "| backend | n | PNG bytes | redirects | median (ms) | p90 (ms) |",
             "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['n']} | {r['bytes']:.0f} | {r['redirects']} | "
                     f"{r['median'] * 1000:.1f} | {r['p90'] * 1000:.1f} |")
    return lines


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=30)
    print("\n".join(report(run(ap.parse_args().n))))
