"""The OpenAI calls' per-key limit on live streams, on a real API process (uvicorn) and a real
Redis with no workers: jobs stay queued, so streams stay open until the test ends them. Calls
arriving at once take exactly the limit's slots, and a slot comes back when its stream ends or
its client goes away."""

import asyncio
import json
import time

import httpx
import pytest

from tests.api.live_api import live_api

KEY = "fm-test-key-streams"
AUTH = {"Authorization": f"Bearer {KEY}"}
LIMIT = 5


@pytest.fixture
def api(redis_url, model_dir, tmp_path):
    with live_api(redis_url, model_dir, tmp_path, {
            "FIBERMILL_API_KEYS": KEY, "FIBERMILL_MAX_WATCHES_PER_CALLER": str(LIMIT),
            "FIBERMILL_RATE_LIMIT_BURST": "1000"}) as base:
        yield base


async def _open(client: httpx.AsyncClient, i: int) -> httpx.Response:
    body = {"model": "pydoc-gpt2", "max_tokens": 2, "stream": True,
            "messages": [{"role": "user", "content": f"call {i}"}]}
    return await client.send(client.build_request("POST", "/v1/chat/completions", json=body,
                                                  headers=AUTH), stream=True)


async def _job_id(lines) -> str:
    """The job of a stream, from its first chunk (the role, sent at once)."""
    async for line in lines:
        if line.startswith("data: "):
            return json.loads(line.removeprefix("data: "))["id"].removeprefix("chatcmpl-")
    raise AssertionError("the stream ended before its first chunk")


async def _open_once_free(client: httpx.AsyncClient) -> httpx.Response:
    """A new stream, once a slot is back (the server lets go of a gone client's slot when it
    notices the disconnect): a refused try takes no slot and submits nothing."""
    deadline = time.monotonic() + 15
    while True:
        resp = await _open(client, 99)
        if resp.status_code == 200:
            return resp
        await resp.aclose()
        assert resp.status_code == 429 and time.monotonic() < deadline, resp.status_code
        await asyncio.sleep(0.05)


async def test_streams_at_once_take_exactly_the_limit_and_give_slots_back(api):
    async with httpx.AsyncClient(base_url=api, timeout=30,
                                 limits=httpx.Limits(max_connections=100)) as client:
        responses = await asyncio.gather(*(_open(client, i) for i in range(30)))
        opened = [r for r in responses if r.status_code == 200]
        refused = [r for r in responses if r.status_code == 429]
        assert (len(opened), len(refused)) == (LIMIT, 30 - LIMIT), [
            r.status_code for r in responses]
        for r in refused:
            await r.aread()
            assert r.json()["error"]["type"] == "rate_limit_error"
            assert f"at most {LIMIT} live streams" in r.json()["error"]["message"]
            assert int(r.headers["Retry-After"]) >= 1
        # A refused call submitted nothing.
        listed = (await client.get("/v1/jobs", headers=AUTH)).json()["jobs"]
        assert len(listed) == LIMIT

        lines = [r.aiter_lines() for r in opened]
        jobs = [await _job_id(it) for it in lines]

        # A stream that ends (its job canceled) gives its slot back as it ends.
        cancel = await client.post(f"/v1/jobs/{jobs[0]}/cancel", headers=AUTH)
        assert cancel.status_code == 200, cancel.text
        rest = [line async for line in lines[0]]
        assert "data: [DONE]" in rest
        await opened[0].aclose()
        sixth = await _open(client, 6)
        assert sixth.status_code == 200
        full = await _open(client, 7)
        assert full.status_code == 429
        await full.aclose()

        # A client that goes away gives its slot back, and its job is canceled.
        await opened[1].aclose()
        seventh = await _open_once_free(client)
        deadline = time.monotonic() + 15
        while (gone := (await client.get(f"/v1/jobs/{jobs[1]}", headers=AUTH)).json()
               )["status"] != "canceled":
            assert time.monotonic() < deadline, gone
            await asyncio.sleep(0.05)
        for r in [*opened[2:], sixth, seventh]:
            await r.aclose()
