"""Bursts of one-prompt tiny-gpt2 jobs from closed-loop clients, for the benchmarks that set two
or more stacks alike but for one setting side by side (replication_cost, trace_cost)."""

from dataclasses import dataclass, field

import aiohttp

from benchmarks.peers import closed_loop, final_job

MODEL = "tiny-gpt2"
CLIENTS = 32
NEW_TOKENS = 4


@dataclass
class Side:
    """One stack's rounds."""

    name: str
    rps: list[float] = field(default_factory=list)
    p50: list[float] = field(default_factory=list)


async def burst(url: str, jobs: int) -> tuple[float, float]:
    """jobs/s and p50 seconds of `jobs` one-prompt jobs from CLIENTS clients."""
    connector = aiohttp.TCPConnector(limit=CLIENTS + 8)
    async with aiohttp.ClientSession(url, connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=300)) as http:
        async def send(i: int) -> int | None:
            body = {"task": "text-generation", "model": MODEL,
                    "input": {"prompts": [f"Job {i} says"], "max_new_tokens": NEW_TOKENS}}
            async with http.post("/v1/jobs", json=body, headers={"Prefer": "wait=60"}) as r:
                r.raise_for_status()
                job = await final_job(http, await r.json())
            if job["status"] != "succeeded":
                raise RuntimeError(f"job {job['id']} {job['status']}: {job.get('error')}")
            return None

        load = await closed_loop(send, list(range(jobs)), CLIENTS)
    return load.rps, load.p50
