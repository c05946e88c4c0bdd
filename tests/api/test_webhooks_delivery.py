"""Webhook delivery through the Redis outbox to a real HTTP receiver on 127.0.0.1."""

import asyncio
import dataclasses
import json
import socket
import ssl
import subprocess
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from standardwebhooks import Webhook, WebhookVerificationError

from services.api.webhooks.outbox import Outbox, webhook_id
from services.api.webhooks.signing import Signer
from services.api.webhooks.ssrf import check_webhook_url
from shared import names
from shared.job import JobMeta, JobStatus
from shared.jobstore import JobRecord, JobStore, NewJob
from shared.settings import Settings
from tests.api.conftest import WEBHOOK_SECRET

# A finished text job's output, as the joiner assembles it.
OUTPUT = [{"text": "ok", "finish_reason": "stop", "tokens": 1, "prompt_tokens": 3,
           "worker": "w/1"}]

HOOK_HOST = "hooks.example.test"


@dataclass
class Hit:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.perf_counter() when it arrived

    @property
    def id(self) -> str:
        return self.headers["webhook-id"]


Answer = Callable[[Hit, int], tuple[int, dict[str, str]]]


def ok(_hit: Hit, _n: int) -> tuple[int, dict[str, str]]:
    return 200, {}


@dataclass
class Receiver:
    """A webhook receiver in a thread; `answer(hit, n)` picks the reply to the n-th request."""

    port: int
    answer: Answer = ok
    tls: ssl.SSLContext | None = None
    hits: list[Hit] = field(default_factory=list)
    unblock: threading.Event = field(default_factory=threading.Event)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    def start(self) -> "Receiver":
        receiver, lock = self, threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                hit = Hit(self.path, {k.lower(): v for k, v in self.headers.items()}, body,
                          time.perf_counter())
                with lock:
                    receiver.hits.append(hit)
                    n = len(receiver.hits)
                status, headers = receiver.answer(hit, n)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        if self.tls is not None:
            # The handshake in the request's own thread, on its first read: done in `accept`,
            # a client that connects and never finishes it blocks the serving loop, and
            # `stop` with it, for good.
            self._server.socket = self.tls.wrap_socket(self._server.socket, server_side=True,
                                                       do_handshake_on_connect=False)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.unblock.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            assert self._thread is not None
            self._thread.join()
            self._server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def receivers() -> Iterator[Callable[..., Receiver]]:
    made: list[Receiver] = []

    def make(answer: Answer = ok, port: int | None = None, tls: ssl.SSLContext | None = None,
             start: bool = True) -> Receiver:
        r = Receiver(port or free_port(), answer, tls)
        made.append(r)
        return r.start() if start else r

    yield make
    for r in made:
        r.stop()


def make_settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "webhook_allow_private": True,
        "webhook_timeout_seconds": 3.0,
        "webhook_retry_total_seconds": 30.0,
        "webhook_progress_interval_seconds": 0.0,
        "webhook_secret": WEBHOOK_SECRET,
    }
    return Settings(**{**values, **overrides})


@pytest.fixture
async def outboxes(aredis, store) -> Any:
    """Start Outboxes on the test Redis: fast backoff, and stopped at the end of the test."""
    running: list[asyncio.Task[None]] = []

    def make(settings: Settings, consumer: str = "api-1", run: bool = True,
             **kwargs: Any) -> tuple[Outbox, asyncio.Task[None] | None]:
        fast = {"webhook_backoff_base_seconds": 0.05, "webhook_backoff_cap_seconds": 0.2}
        settings = settings.model_copy(update=fast)
        ob = Outbox(aredis, store, settings, consumer, **kwargs)
        task = asyncio.create_task(ob.run()) if run else None
        if task is not None:
            running.append(task)
        return ob, task

    yield make
    for t in running:
        t.cancel()
    await asyncio.gather(*running, return_exceptions=True)


async def new_job(store: JobStore, url: str | None, events: list[str] | None = None,
                  final: bool = True, owner: str | None = None) -> JobRecord:
    job_id = uuid.uuid4().hex
    meta = JobMeta(webhook=url, webhook_events_filter=events or ["completed"], owner=owner)
    await store.create(NewJob(job_id, "text-generation", "tiny-gpt2", {"prompt": "hi"}, 1, meta))
    if final:
        await store.finalize(job_id, JobStatus.SUCCEEDED, OUTPUT)
    return await store.get(job_id)


async def eventually(check: Callable[[], Awaitable[Any] | Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout}s")
        await asyncio.sleep(0.01)


def counted(outcome: str) -> float:
    v = REGISTRY.get_sample_value("fibermill_webhook_deliveries_total", {"outcome": outcome})
    return v or 0.0


async def attempts(store: JobStore, job_id: str, n: int, timeout: float = 5.0) -> list:
    async def enough() -> list | None:
        d = (await store.get(job_id)).webhook_deliveries
        return d if len(d) >= n else None

    return await eventually(enough, timeout)


# Delivery -----------------------------------------------------------------------------------

async def test_completed_arrives_once_signed_with_the_job(store, receivers, outboxes):
    settings = make_settings()
    r = receivers()
    ob, _ = outboxes(settings)
    delivered = counted("delivered")
    rec = await new_job(store, r.url)
    await ob.enqueue(rec, "completed")

    await eventually(lambda: r.hits)
    hit = r.hits[0]
    body = Webhook(settings.webhook_secret).verify(hit.body, hit.headers)
    assert hit.id == webhook_id(rec.id, "completed")
    assert hit.headers["content-type"] == "application/json"
    assert body["id"] == rec.id and body["status"] == "succeeded"
    assert body["output"] == OUTPUT and body["completed_at"]
    (d,) = await attempts(store, rec.id, 1)
    assert (d.webhook_id, d.event, d.attempt, d.status_code, d.error) == (
        hit.id, "completed", 1, 200, None)
    await asyncio.sleep(0.3)
    assert len(r.hits) == 1
    assert counted("delivered") == delivered + 1


async def test_5xx_is_retried_with_the_same_webhook_id(store, receivers, outboxes):
    settings = make_settings()
    r = receivers(lambda _h, n: (500, {}) if n <= 3 else (200, {}))
    ob, _ = outboxes(settings)
    retrying = counted("retrying")
    rec = await new_job(store, r.url)
    await ob.enqueue(rec, "completed")

    await eventually(lambda: len(r.hits) >= 4)
    assert {h.id for h in r.hits} == {webhook_id(rec.id, "completed")}
    for h in r.hits:
        Webhook(settings.webhook_secret).verify(h.body, h.headers)
    ds = await attempts(store, rec.id, 4)
    assert [(d.attempt, d.status_code) for d in ds] == [(1, 500), (2, 500), (3, 500), (4, 200)]
    assert counted("retrying") == retrying + 3
    await asyncio.sleep(0.3)
    assert len(r.hits) == 4


async def test_receiver_down_across_an_outbox_restart(store, receivers, outboxes):
    settings = make_settings()
    r = receivers(start=False)  # down: connections are refused
    first, task = outboxes(settings, "api-1")
    rec = await new_job(store, r.url)
    await first.enqueue(rec, "completed")
    await attempts(store, rec.id, 3)
    assert task is not None
    task.cancel()  # the API replica goes away while the receiver is still down
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.sleep(1.0)

    r.start()
    outboxes(settings, "api-2")  # another replica, same Redis: it resumes the delivery
    await eventually(lambda: r.hits)
    ds = await attempts(store, rec.id, 4)
    await asyncio.sleep(0.3)
    assert len(r.hits) == 1 and r.hits[0].id == webhook_id(rec.id, "completed")
    ds = (await store.get(rec.id)).webhook_deliveries
    assert [d.attempt for d in ds] == list(range(1, len(ds) + 1))
    assert all(d.status_code is None and d.error for d in ds[:-1])
    assert ds[-1].status_code == 200


async def test_an_attempt_on_record_keeps_its_number_when_its_replica_stops(
    store, receivers, outboxes, monkeypatch
):
    """The replica stops right after recording a failed attempt: the next replica's attempt
    takes the next number, it does not repeat this one."""
    settings = make_settings()
    r = receivers(start=False)  # down: the first attempt fails
    first, task = outboxes(settings, "api-1")
    record = store.record_delivery

    async def record_then_stop(job_id, delivery):
        await record(job_id, delivery)
        # The replica goes away between recording and settling the attempt.
        for sending in [t for busy in first._busy.values() for t in busy]:
            sending.cancel()
        task.cancel()

    monkeypatch.setattr(store, "record_delivery", record_then_stop)
    rec = await new_job(store, r.url)
    await first.enqueue(rec, "completed")
    await asyncio.gather(task, return_exceptions=True)
    monkeypatch.setattr(store, "record_delivery", record)
    r.start()
    outboxes(settings, "api-2")
    ds = await attempts(store, rec.id, 2)
    assert [d.attempt for d in ds] == [1, 2]
    assert ds[0].status_code is None and ds[1].status_code == 200


async def test_4xx_is_final(store, receivers, outboxes):
    settings = make_settings()
    r = receivers(lambda _h, _n: (410, {}))
    ob, _ = outboxes(settings)
    failed = counted("failed")
    rec = await new_job(store, r.url)
    await ob.enqueue(rec, "completed")

    (d,) = await attempts(store, rec.id, 1)
    await asyncio.sleep(0.5)
    assert len(r.hits) == 1
    assert (d.status_code, d.attempt) == (410, 1)
    assert len((await store.get(rec.id)).webhook_deliveries) == 1
    assert counted("failed") == failed + 1


async def test_redirect_is_not_followed_and_is_retried(store, receivers, outboxes):
    settings = make_settings()

    def answer(_h: Hit, n: int) -> tuple[int, dict[str, str]]:
        return (307, {"location": "/elsewhere"}) if n == 1 else (200, {})

    r = receivers(answer)
    ob, _ = outboxes(settings)
    rec = await new_job(store, r.url)
    await ob.enqueue(rec, "completed")

    ds = await attempts(store, rec.id, 2)
    assert [(d.status_code, d.error) for d in ds] == [(307, "redirect not followed"), (200, None)]
    assert [h.path for h in r.hits] == ["/hook", "/hook"]


async def test_429_retry_after_is_honoured(store, receivers, outboxes):
    settings = make_settings()
    r = receivers(lambda _h, n: (429, {"retry-after": "1"}) if n == 1 else (200, {}))
    ob, _ = outboxes(settings)
    rec = await new_job(store, r.url)
    await ob.enqueue(rec, "completed")

    ds = await attempts(store, rec.id, 2)
    assert [d.status_code for d in ds] == [429, 200]
    # Backoff alone would have retried within 0.2 s.
    assert r.hits[1].at - r.hits[0].at >= 0.95


async def test_gives_up_when_the_retry_window_is_over(store, receivers, outboxes):
    settings = make_settings(webhook_retry_total_seconds=0.5)
    r = receivers(lambda _h, _n: (503, {}))
    ob, _ = outboxes(settings)
    failed = counted("failed")
    rec = await new_job(store, r.url)
    await ob.enqueue(rec, "completed")

    await eventually(lambda: counted("failed") == failed + 1)
    n = len(r.hits)
    assert n >= 2
    await asyncio.sleep(0.4)
    assert len(r.hits) == n
    assert len((await store.get(rec.id)).webhook_deliveries) == n


async def test_two_replicas_deliver_each_webhook_exactly_once(store, receivers, outboxes):
    settings = make_settings()
    r = receivers()
    a, _ = outboxes(settings, "api-1")
    b, _ = outboxes(settings, "api-2")
    recs = [await new_job(store, r.url) for _ in range(20)]
    for rec in recs:  # both replicas saw the job finish
        await asyncio.gather(a.enqueue(rec, "completed"), b.enqueue(rec, "completed"))

    await eventually(lambda: len(r.hits) >= 20)
    await asyncio.sleep(0.5)
    assert sorted(h.id for h in r.hits) == sorted(webhook_id(x.id, "completed") for x in recs)
    for rec in recs:
        # One delivery reached the receiver; an attempt that failed on the way (a connect
        # error on a loaded machine) is retried, never sent twice by the two replicas.
        deliveries = (await store.get(rec.id)).webhook_deliveries
        ok = [d for d in deliveries if d.status_code is not None and 200 <= d.status_code < 300]
        assert len(ok) == 1 and deliveries[-1] is ok[0], deliveries


async def test_enqueue_is_idempotent_and_follows_the_filter(store, receivers, outboxes):
    settings = make_settings()
    r = receivers()
    ob, _ = outboxes(settings)
    rec = await new_job(store, r.url)  # filter: completed only
    no_hook = await new_job(store, None)
    await ob.enqueue(rec, "start")
    await ob.enqueue(rec, "progress")
    await ob.enqueue(no_hook, "completed")
    await ob.enqueue(rec, "completed")
    await ob.enqueue(rec, "completed")

    await attempts(store, rec.id, 1)
    await ob.enqueue(rec, "completed")  # late, e.g. from a replica that was slow
    await asyncio.sleep(0.4)
    assert [h.id for h in r.hits] == [webhook_id(rec.id, "completed")]
    assert (await store.get(no_hook.id)).webhook_deliveries == []


async def test_progress_is_throttled(store, receivers, outboxes):
    settings = make_settings(webhook_progress_interval_seconds=0.5)
    r = receivers()
    ob, _ = outboxes(settings)
    rec = await new_job(store, r.url, ["start", "progress", "completed"], final=False)
    await ob.enqueue(rec, "start")
    for done in range(1, 6):
        await ob.enqueue(dataclasses.replace(rec, done=done), "progress")
    await eventually(lambda: len(r.hits) >= 2)
    await asyncio.sleep(0.6)  # the interval is over: the next one goes
    await ob.enqueue(dataclasses.replace(rec, done=6), "progress")
    await ob.enqueue(dataclasses.replace(rec, done=7), "progress")
    await eventually(lambda: len(r.hits) >= 3)
    await asyncio.sleep(0.3)
    assert sorted(h.id for h in r.hits) == sorted([
        webhook_id(rec.id, "start"),
        webhook_id(rec.id, "progress", 1),
        webhook_id(rec.id, "progress", 6),
    ])
    for h in r.hits:
        assert Webhook(settings.webhook_secret).verify(h.body, h.headers)["status"] == "queued"


async def test_updates_never_hold_up_completed(store, receivers, outboxes):
    settings = make_settings()

    def answer(hit: Hit, _n: int) -> tuple[int, dict[str, str]]:
        if "_progress_" in hit.id:
            r.unblock.wait(5)  # a receiver that is slow to take progress updates
        return 200, {}

    r = receivers(answer)
    ob, _ = outboxes(settings, max_in_flight=4, max_updates_in_flight=4)
    busy = [await new_job(store, r.url, ["progress", "completed"], final=False)
            for _ in range(8)]
    for rec in busy:
        await ob.enqueue(rec, "progress")
    await eventually(lambda: len(r.hits) >= 4)  # every update slot is stuck

    rec = await new_job(store, r.url)
    t0 = time.perf_counter()
    await ob.enqueue(rec, "completed")
    hit = await eventually(lambda: next((h for h in r.hits if "_completed" in h.id), None))
    assert hit.at - t0 < 0.5
    r.unblock.set()


async def test_stale_updates_and_gone_jobs_are_dropped(store, aredis, receivers, outboxes):
    settings = make_settings()
    r = receivers()
    ob, _ = outboxes(settings, run=False)
    dropped = counted("dropped")
    gone = await new_job(store, r.url)
    await ob.enqueue(gone, "completed")
    await aredis.delete(names.job_key(gone.id))
    running = await new_job(store, r.url, ["progress", "completed"], final=False)
    await ob.enqueue(running, "progress")
    await store.finalize(running.id, JobStatus.SUCCEEDED, OUTPUT)  # before it is sent

    outboxes(settings, "api-2")
    await eventually(lambda: counted("dropped") == dropped + 2)
    await ob.enqueue(await store.get(running.id), "completed")
    await eventually(lambda: r.hits)
    await asyncio.sleep(0.2)
    assert [h.id for h in r.hits] == [webhook_id(running.id, "completed")]


# Signing secrets per API key ----------------------------------------------------------------

def verifies(secret: str, hit: Hit) -> bool:
    try:
        Webhook(secret).verify(hit.body, hit.headers)
    except WebhookVerificationError:
        return False
    return True


async def test_one_keys_webhooks_do_not_verify_with_another_keys_secret(
    store, receivers, outboxes
):
    settings = make_settings()
    r = receivers()
    ob, _ = outboxes(settings)
    secret_a = (await ob.keyring.secrets("key-a"))[0].secret
    secret_b = (await ob.keyring.secrets("key-b"))[0].secret
    job_a = await new_job(store, r.url, owner="key-a")
    job_b = await new_job(store, r.url, owner="key-b")
    await ob.enqueue(job_a, "completed")
    await ob.enqueue(job_b, "completed")

    await eventually(lambda: len(r.hits) >= 2)
    hits = {json.loads(h.body)["id"]: h for h in r.hits}
    assert verifies(secret_a, hits[job_a.id]) and verifies(secret_b, hits[job_b.id])
    assert not verifies(secret_b, hits[job_a.id]) and not verifies(secret_a, hits[job_b.id])
    for hit in hits.values():  # nor with the install-wide secret everyone used to share
        assert not verifies(settings.webhook_secret, hit)
    # What key A's caller can make with its own secret: B's job "succeeded", signed by A.
    forged = hits[job_b.id]
    headers = Signer(secret_a).headers(forged.id, forged.body.decode())
    assert not verifies(secret_b, dataclasses.replace(forged, headers=headers))


async def test_a_rotation_overlaps_then_only_the_new_secret_signs(store, receivers, outboxes):
    overlap = 3  # long enough for the first delivery to be signed within it on a busy host
    settings = make_settings(webhook_secret_overlap_seconds=overlap)
    r = receivers()
    ob, _ = outboxes(settings)
    (old,) = await ob.keyring.secrets("key-a")
    new = (await ob.keyring.rotate("key-a"))[0]
    during = await new_job(store, r.url, owner="key-a")
    await ob.enqueue(during, "completed")
    hit = await eventually(lambda: next(iter(r.hits), None))
    # A receiver still holding the old secret, and one already on the new, both accept it.
    assert verifies(old.secret, hit) and verifies(new.secret, hit)

    await eventually(lambda: _one_secret(ob, "key-a"), timeout=overlap + 5)
    after = await new_job(store, r.url, owner="key-a")
    await ob.enqueue(after, "completed")
    await eventually(lambda: len(r.hits) >= 2)
    assert json.loads(r.hits[1].body)["id"] == after.id
    assert verifies(new.secret, r.hits[1]) and not verifies(old.secret, r.hits[1])


async def _one_secret(ob: Outbox, owner: str) -> bool:
    return len(await ob.keyring.secrets(owner)) == 1


async def test_a_delivery_in_flight_across_a_rotation_verifies_with_either_secret(
    store, receivers, outboxes
):
    """Its retries after the rotation carry both signatures: the receiver need not switch
    secrets at the very moment of the rotation."""
    settings = make_settings()
    switched: list[str] = []  # the receiver's secret once it has switched to the new one
    r = receivers(lambda h, _n: (200, {}) if switched and verifies(switched[0], h)
                  else (503, {}))
    ob, _ = outboxes(settings)
    (old,) = await ob.keyring.secrets("key-a")
    job = await new_job(store, r.url, owner="key-a")
    await ob.enqueue(job, "completed")
    await eventually(lambda: r.hits)  # refused: it is being retried
    assert verifies(old.secret, r.hits[0])
    new = (await ob.keyring.rotate("key-a"))[0]
    switched.append(new.secret)

    async def delivered() -> bool:
        return any(d.status_code == 200 for d in (await store.get(job.id)).webhook_deliveries)

    await eventually(delivered)
    last = r.hits[-1]  # the one answered 200
    assert verifies(new.secret, last) and verifies(old.secret, last)


# SSRF at send time --------------------------------------------------------------------------

@pytest.fixture
def fake_dns(monkeypatch) -> dict[str, list[str]]:
    """Names in the returned map resolve to its addresses, one list per lookup in turn (the
    last one repeats); everything else goes to the real resolver."""
    answers: dict[str, list[list[str]]] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> list:
        name = host.decode() if isinstance(host, bytes) else host
        if name not in answers:
            return real(host, port, *args, **kwargs)
        seq = answers[name]
        addrs = seq.pop(0) if len(seq) > 1 else seq[0]
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, int(port or 0))) for a in addrs]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers


async def test_send_refuses_a_private_target(store, receivers, outboxes):
    settings = make_settings(webhook_allow_private=False)
    r = receivers()
    ob, _ = outboxes(settings)
    rec = await new_job(store, r.url)  # as if it had slipped past validation
    await ob.enqueue(rec, "completed")

    (d,) = await attempts(store, rec.id, 1)
    await asyncio.sleep(0.3)
    assert r.hits == []
    assert d.status_code is None and "loopback" in d.error
    assert len((await store.get(rec.id)).webhook_deliveries) == 1  # final: not retried


async def test_send_checks_again_after_dns_rebinding(store, receivers, outboxes, fake_dns):
    settings = make_settings(webhook_allow_private=False)
    r = receivers()
    fake_dns[HOOK_HOST] = [["93.184.216.34"], ["127.0.0.1"]]
    url = f"http://{HOOK_HOST}:{r.port}/hook"
    await check_webhook_url(url, allow_private=False)  # public when the job was submitted
    ob, _ = outboxes(settings)
    rec = await new_job(store, url)
    await ob.enqueue(rec, "completed")

    (d,) = await attempts(store, rec.id, 1)
    await asyncio.sleep(0.3)
    assert r.hits == [] and "127.0.0.1 is a loopback address" in d.error


async def test_send_keeps_the_host_header_on_the_pinned_address(
    store, receivers, outboxes, fake_dns
):
    settings = make_settings()
    r = receivers()
    fake_dns[HOOK_HOST] = [["127.0.0.1"]]
    ob, _ = outboxes(settings)
    rec = await new_job(store, f"http://{HOOK_HOST}:{r.port}/hook")
    await ob.enqueue(rec, "completed")

    await eventually(lambda: r.hits)
    assert r.hits[0].headers["host"] == f"{HOOK_HOST}:{r.port}"


@pytest.fixture(scope="module")
def cert(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem"), "-days", "2",
         "-subj", f"/CN={HOOK_HOST}", "-addext", f"subjectAltName=DNS:{HOOK_HOST}"],
        check=True, capture_output=True,
    )
    return d / "cert.pem", d / "key.pem"


async def test_https_verifies_the_hostname_on_the_pinned_address(
    store, receivers, outboxes, fake_dns, cert
):
    """The certificate names the host, not 127.0.0.1: the handshake passes only if SNI and
    verification use the hostname while the connection goes to the pinned address."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(*map(str, cert))
    sni: list[str | None] = []
    server.sni_callback = lambda _sock, name, _ctx: sni.append(name)
    r = receivers(tls=server)
    fake_dns[HOOK_HOST] = [["127.0.0.1"]]
    fake_dns["other.example.test"] = [["127.0.0.1"]]
    ob, _ = outboxes(make_settings(), verify=ssl.create_default_context(cafile=str(cert[0])))
    good = await new_job(store, f"https://{HOOK_HOST}:{r.port}/hook")
    bad = await new_job(store, f"https://other.example.test:{r.port}/hook")
    await ob.enqueue(good, "completed")
    await ob.enqueue(bad, "completed")

    (d,) = await attempts(store, good.id, 1)
    assert d.status_code == 200 and len(r.hits) == 1
    assert json.loads(r.hits[0].body)["id"] == good.id
    assert HOOK_HOST in sni
    bad_attempt = (await attempts(store, bad.id, 1))[0]
    assert bad_attempt.status_code is None and "certificate" in bad_attempt.error.lower()
    assert [json.loads(h.body)["id"] for h in r.hits] == [good.id]

