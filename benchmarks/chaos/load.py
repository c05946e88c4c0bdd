"""The client side of a chaos run: submissions that retry like a careful client, and a tracker
that polls every accepted job to its final state.

A careful client retries a POST that got no answer or a 5xx with the same Idempotency-Key, on
the other replica (what a load balancer would do), so every retry is safe and counted: the
counts are how the run tells an outage the client rode out from one it could not.
"""

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable

import httpx

from benchmarks.chaos.report import ChaosResult

FINAL = {"succeeded", "failed", "canceled"}
RETRY_PAUSE = (0.2, 0.5, 1.0, 2.0)
READ_CONCURRENCY = 8
POLL_PAUSE = 0.5


class Client:
    """One httpx client per API replica, and the counts of what they answered."""

    def __init__(self, urls: list[str], result: ChaosResult, timeout: float = 30.0) -> None:
        self.http = [httpx.AsyncClient(base_url=u, timeout=timeout) for u in urls]
        self.result = result

    async def aclose(self) -> None:
        for h in self.http:
            await h.aclose()

    async def submit(self, n: int, body: dict, key: str | None, give_up_at: float) -> str | None:
        """The job id the API accepted `body` under, or None once `give_up_at` passed."""
        headers = {"Idempotency-Key": key} if key else {}
        r = self.result
        attempt = 0
        while time.time() < give_up_at:
            http = self.http[(n + attempt) % len(self.http)]
            try:
                resp = await http.post("/v1/jobs", json=body, headers=headers)
            except httpx.TimeoutException as exc:
                r.submit_timeouts += 1
                r.example("submit_timeouts", type(exc).__name__)
            except httpx.TransportError:
                r.submit_conn_errors += 1
            else:
                if resp.status_code in (200, 202):
                    return resp.json()["id"]
                if _not_replicated(resp):
                    # Designed: the job is stored on the primary and bound to the key, and a
                    # retry returns it once a replica has it (shared/errors.py NotReplicated).
                    r.submit_not_replicated += 1
                elif resp.status_code >= 500:
                    r.submit_5xx += 1
                    r.example("submit_5xx", f"{resp.status_code} {resp.text[:160]}")
                elif resp.status_code == 409:
                    r.submit_409 += 1
                else:  # a 4xx other than 409 is final: the body or the harness is wrong
                    r.example("not_accepted", f"{resp.status_code} {resp.text[:160]}")
                    return None
            await asyncio.sleep(RETRY_PAUSE[min(attempt, len(RETRY_PAUSE) - 1)])
            attempt += 1
        r.example("not_accepted", f"job {n}: gave up retrying")
        return None

    async def get(self, path: str, n: int) -> httpx.Response | None:
        """GET from replica `n % 2`; None (counted) when it did not answer."""
        try:
            resp = await self.http[n % len(self.http)].get(path)
        except httpx.TransportError as exc:
            self.result.read_conn_errors += 1
            self.result.example("read_conn_errors", f"{path}: {type(exc).__name__}")
            return None
        if resp.status_code >= 500:
            self.result.read_5xx += 1
        return resp

    async def fetch(self, path: str, patience: float = 60.0) -> bytes:
        """The body of a GET that must succeed, from whichever replica answers within
        `patience` seconds; raises otherwise (a 4xx at once)."""
        until = time.monotonic() + patience
        attempt = 0
        while True:
            resp = await self.get(path, attempt)
            if resp is not None and resp.status_code < 500:
                resp.raise_for_status()
                return resp.content
            if time.monotonic() > until:
                raise RuntimeError(f"GET {path}: no answer but 5xx or errors in {patience}s")
            await asyncio.sleep(0.5)
            attempt += 1


def _not_replicated(resp: httpx.Response) -> bool:
    if resp.status_code != 503:
        return False
    try:
        body = resp.json()
    except ValueError:
        return False
    return isinstance(body, dict) and "not_replicated" in (body.get("code"), body.get("type"))


class Tracker:
    """Polls jobs until each is final, handing every final one to `on_final` once.

    Every pending job is read every `every` seconds, and a job `hinted()` names (its webhook
    came) at the next round: reading all of a deep backlog twice a second would cost the API
    replicas more CPU than the workers get on a small machine. The hint only hurries a read;
    a job whose webhook never comes is still found final by the regular reads."""

    def __init__(self, client: Client, on_final: Callable[[dict], Awaitable[None]],
                 every: float = POLL_PAUSE,
                 hinted: Callable[[], Iterable[str]] = tuple) -> None:
        self.client = client
        self.on_final = on_final
        self.every = every
        self.hinted = hinted
        self.pending: set[str] = set()
        self.final: dict[str, dict] = {}
        self.gone: set[str] = set()  # answered 404 at its last poll
        self.last_final_at = time.time()  # when a job was last seen to become final
        self.rounds = 0
        self._read_at: dict[str, float] = {}
        self._sem = asyncio.Semaphore(READ_CONCURRENCY)

    def add(self, job_id: str) -> None:
        self.pending.add(job_id)
        self._read_at[job_id] = time.monotonic()

    async def _poll(self, job_id: str) -> None:
        async with self._sem:
            self._read_at[job_id] = time.monotonic()
            resp = await self.client.get(f"/v1/jobs/{job_id}", self.rounds)
            if resp is None or resp.status_code >= 500:
                return
            if resp.status_code == 404:
                self.gone.add(job_id)
                return
            resp.raise_for_status()
            self.gone.discard(job_id)
            job = resp.json()
            if job["status"] in FINAL and job_id in self.pending:
                self.pending.discard(job_id)
                self.final[job_id] = job
                self.last_final_at = time.time()
                await self.on_final(job)

    def _due(self) -> set[str]:
        stale = time.monotonic() - self.every
        hinted = self.pending.intersection(self.hinted())
        return hinted | {j for j in self.pending if self._read_at[j] <= stale}

    async def run_until(self, done: Callable[[], bool]) -> None:
        """Poll in rounds, each on the other replica, until `done()`."""
        while not done():
            self.rounds += 1
            await asyncio.gather(*(self._poll(j) for j in self._due()))
            await asyncio.sleep(POLL_PAUSE)
