"""The chaos run's webhook receiver: an HTTP server thread that keeps every delivery it gets,
and the verdict on them once the jobs are final.

It verifies each signature as it arrives (a body and its headers are all it needs) and always
answers 204, so that whatever goes wrong is the sender's doing and shows in the counts; missing,
duplicate and conflicting deliveries can only be told apart against the jobs' final records.
"""

import asyncio
import json
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks import Webhook

from benchmarks.chaos.report import ChaosResult


@dataclass(frozen=True)
class Delivery:
    webhook_id: str
    job_id: str | None  # None when the body is not a job envelope
    event: str
    verified: bool
    # The job's final state as the body tells it (status, output, error), as canonical JSON:
    # two deliveries of one event may differ in their delivery log, never in this.
    content: str
    at: float


def content_key(job: dict) -> str:
    return json.dumps([job.get("status"), job.get("output"), job.get("error")], sort_keys=True)


def _event(webhook_id: str) -> str:
    # The sender names deliveries `msg_<job>_<event>[_<seq>]` (services/api/webhooks/outbox.py);
    # the event is not in the body, which is the job itself.
    parts = webhook_id.split("_")
    return parts[2] if len(parts) >= 3 else "?"


class Receiver:
    def __init__(self, port: int, secret: str) -> None:
        self.url = f"http://127.0.0.1:{port}/hook"
        self._webhook = Webhook(secret)
        self._lock = threading.Lock()
        self._deliveries: list[Delivery] = []
        self._job_ids: set[str] = set()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                outer._keep(headers, body)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="chaos-webhooks",
                                        daemon=True)
        self._thread.start()

    def _keep(self, headers: dict[str, str], body: bytes) -> None:
        try:
            self._webhook.verify(body, headers)
            verified = True
        except Exception:  # any failure to verify is the count this receiver exists for
            verified = False
        try:
            job = json.loads(body)
        except ValueError:
            job = {}
        webhook_id = headers.get("webhook-id", "")
        delivery = Delivery(webhook_id, job.get("id") if isinstance(job, dict) else None,
                            _event(webhook_id), verified,
                            content_key(job) if isinstance(job, dict) else "", time.time())
        with self._lock:
            self._deliveries.append(delivery)
            if delivery.job_id is not None:
                self._job_ids.add(delivery.job_id)

    def by_job(self, event: str = "completed") -> dict[str, list[Delivery]]:
        grouped: dict[str, list[Delivery]] = defaultdict(list)
        with self._lock:
            for d in self._deliveries:
                if d.event == event and d.job_id is not None:
                    grouped[d.job_id].append(d)
        return grouped

    def job_ids(self) -> set[str]:
        """Jobs that got any delivery: a hint for the tracker to read them now."""
        with self._lock:
            return set(self._job_ids)

    def all(self) -> list[Delivery]:
        with self._lock:
            return list(self._deliveries)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


async def judge_webhooks(receiver: Receiver, final: dict[str, dict], result: ChaosResult,
                         grace: float) -> None:
    """Exactly one verified `completed` webhook per final job, saying what its record says;
    the same delivery again (same webhook-id and content) is at-least-once, and counted.
    Deliveries still on their way get `grace` seconds after the last job became final."""
    deadline = time.monotonic() + grace
    while set(final) - set(receiver.by_job()) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    got = receiver.by_job()
    result.webhooks_unverified = sum(not d.verified for d in receiver.all())
    for job_id, job in final.items():
        verified = [d for d in got.get(job_id, []) if d.verified]
        if not verified:
            result.webhooks_missing += 1
            result.example("webhooks_missing", job_id)
            continue
        ids = {d.webhook_id for d in verified}
        contents = {d.content for d in verified}
        if len(ids) > 1 or contents != {content_key(job)}:
            result.webhooks_conflicting += 1
            result.example("webhooks_conflicting", job_id)
        result.webhook_duplicates += len(verified) - 1
