"""`make bench`, the OpenAI-compatible part, on the bench's running stack:

- a 1,000-line batch (the Batch API, through the official client) against the same prompts as
  1,000 individual jobs (32 clients, each waiting for its job with `Prefer: wait`);
- streaming: time to the first token and tokens per second after it, against the whole answer
  of the same request unstreamed.
"""

import asyncio
import io
import json
import statistics
import time

import httpx
import openai

BATCH_LINES = 1000
BATCH_MODEL = "tiny-gpt2"
BATCH_TOKENS = 8
CLIENTS = 32
STREAM_MODEL = "tiny-gpt2"  # random weights: it rarely ends early, so the stream is long
STREAM_TOKENS = 200
STREAM_PROMPT = "Once upon a time"


def _prompt(i: int) -> str:
    return f"Item {i} says"


def batch_seconds(client: openai.OpenAI) -> tuple[float, dict]:
    lines = [json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions",
                         "body": {"model": BATCH_MODEL, "prompt": _prompt(i),
                                  "max_tokens": BATCH_TOKENS, "temperature": 0}})
             for i in range(BATCH_LINES)]
    t0 = time.perf_counter()
    upload = client.files.create(file=("bench.jsonl", io.BytesIO("\n".join(lines).encode())),
                                 purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/completions",
                                  completion_window="24h")
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(0.1)
        batch = client.batches.retrieve(batch.id)
    elapsed = time.perf_counter() - t0
    assert batch.status == "completed", batch
    counts = batch.request_counts
    assert counts is not None and counts.completed == BATCH_LINES, counts
    return elapsed, {"completed": counts.completed, "failed": counts.failed}


async def _individual(base_url: str) -> float:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(BATCH_LINES):
        queue.put_nowait(i)

    async def worker(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            body = {"model": BATCH_MODEL, "input": {"prompts": [_prompt(i)],
                                                    "max_new_tokens": BATCH_TOKENS}}
            job = (await http.post("/v1/jobs", json=body,
                                   headers={"Prefer": "wait=60"})).json()
            while job["status"] not in ("succeeded", "failed", "canceled"):
                await asyncio.sleep(0.01)
                job = (await http.get(f"/v1/jobs/{job['id']}")).json()
            assert job["status"] == "succeeded", job

    t0 = time.perf_counter()
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
        await asyncio.gather(*(worker(http) for _ in range(CLIENTS)))
    return time.perf_counter() - t0


def _whole(client: openai.OpenAI) -> None:
    client.completions.create(model=STREAM_MODEL, prompt=STREAM_PROMPT,
                              max_tokens=STREAM_TOKENS, temperature=0)


def streaming(client: openai.OpenAI, n: int) -> dict:
    _whole(client)  # warm-up
    first, rates, whole, totals = [], [], [], []
    for _ in range(n):
        t0 = time.perf_counter()
        seen = None
        tokens = 0
        for chunk in client.completions.create(model=STREAM_MODEL, prompt=STREAM_PROMPT,
                                               max_tokens=STREAM_TOKENS, temperature=0,
                                               stream=True,
                                               stream_options={"include_usage": True}):
            if chunk.choices and chunk.choices[0].text and seen is None:
                seen = time.perf_counter()
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        end = time.perf_counter()
        assert seen is not None
        first.append(seen - t0)
        totals.append(end - t0)
        rates.append((tokens - 1) / (end - seen) if end > seen and tokens > 1 else 0.0)
        t1 = time.perf_counter()
        _whole(client)
        whole.append(time.perf_counter() - t1)
    return {"n": n, "tokens": tokens, "ttft": statistics.median(first),
            "stream_total": statistics.median(totals), "tokens_per_s": statistics.median(rates),
            "unstreamed": statistics.median(whole)}


def run(base_url: str, n: int = 10) -> dict:
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0,
                       timeout=600) as client:
        stream = streaming(client, n)
        batch, counts = batch_seconds(client)
    individual = asyncio.run(_individual(base_url))
    return {"batch": batch, "counts": counts, "individual": individual, "stream": stream}


def report(r: dict) -> list[str]:
    s = r["stream"]
    return [
        "## OpenAI-compatible endpoints", "",
        f"A {BATCH_LINES}-line batch through the Batch API (official `openai` client: upload,",
        "create, poll every 0.1 s until `completed`) against the same prompts as individual",
        f"jobs ({CLIENTS} clients, each posting one job with `Prefer: wait` and waiting for it),",
        f"{BATCH_MODEL}, {BATCH_TOKENS} new tokens, greedy; one CPU worker.", "",
        "| what | seconds | lines/s | ratio |",
        "|---|---|---|---|",
        f"| {BATCH_LINES} individual jobs, c={CLIENTS} | {r['individual']:.1f} | "
        f"{BATCH_LINES / r['individual']:.0f} | 1.00x |",
        f"| one {BATCH_LINES}-line batch | {r['batch']:.1f} | {BATCH_LINES / r['batch']:.0f} | "
        f"{r['individual'] / r['batch']:.2f}x |",
        "",
        f"Streaming ({STREAM_MODEL}, one prompt, {s['tokens']} tokens, greedy, "
        f"`stream: true`; medians of {s['n']}):", "",
        "| what | value |",
        "|---|---|",
        f"| time to first token | {s['ttft'] * 1000:.0f} ms |",
        f"| tokens/s after the first | {s['tokens_per_s']:.0f} |",
        f"| whole streamed answer | {s['stream_total'] * 1000:.0f} ms |",
        f"| the same request unstreamed | {s['unstreamed'] * 1000:.0f} ms |",
        f"| first token, as a share of the unstreamed answer | "
        f"{s['ttft'] / s['unstreamed']:.0%} |",
    ]
