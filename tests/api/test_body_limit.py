"""Bodies over FIBERMILL_MAX_BODY_BYTES get a 413 as soon as the limit is passed, declared or
streamed, and the app never holds more than the limit."""

import json
import socket
import threading
import time

import pytest
import uvicorn
from fastapi.testclient import TestClient

from services.api.app import create_app
from services.api.body_limit import BodyLimitMiddleware
from services.devstack.redis_server import free_port
from shared import names
from shared.settings import get_settings

LIMIT = 2048
BIG = {"task": "text-generation", "model": "tiny-gpt2", "input": {"prompts": ["x" * 3000]}}


@pytest.fixture
def limited_env(settings_env, monkeypatch):
    monkeypatch.setenv("FIBERMILL_MAX_BODY_BYTES", str(LIMIT))
    get_settings.cache_clear()


@pytest.fixture
def client(limited_env):
    with TestClient(create_app()) as c:
        yield c


def _no_jobs(redis_url) -> bool:
    import redis

    with redis.Redis.from_url(redis_url) as r:
        return not list(r.scan_iter(match=f"{names.PREFIX}:job:*"))


def _assert_413(resp) -> None:
    assert resp.status_code == 413, resp.text
    body = resp.json()
    assert body["code"] == "payload_too_large" and str(LIMIT) in body["detail"]


def test_declared_length_over_the_limit_is_413(client, redis_url):
    resp = client.post("/v1/jobs", json=BIG)
    assert int(resp.request.headers["content-length"]) > LIMIT
    _assert_413(resp)
    assert _no_jobs(redis_url)


def test_chunked_body_over_the_limit_is_413(client, redis_url):
    data = json.dumps(BIG).encode()

    def chunks():
        for i in range(0, len(data), 500):
            yield data[i : i + 500]

    resp = client.post("/v1/jobs", content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in resp.request.headers
    _assert_413(resp)
    assert _no_jobs(redis_url)


def test_body_within_the_limit_passes(client):
    small = {"task": "text-generation", "model": "tiny-gpt2", "input": {"prompts": ["x"]}}
    assert client.post("/v1/jobs", json=small).status_code == 202


class _Upload:
    """An ASGI receive that hands out `n` chunks and counts how many were taken."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size, self.taken = n, size, 0

    async def __call__(self) -> dict:
        self.taken += 1
        more = self.taken < self.n
        return {"type": "http.request", "body": b"x" * self.size, "more_body": more}


class _ReadingApp:
    """Reads the whole body like a framework would, then answers 200 (or 400 if it lost it)."""

    def __init__(self) -> None:
        self.seen = 0
        self.called = False

    async def __call__(self, scope, receive, send) -> None:
        self.called = True
        status = 200
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                status = 400
                break
            self.seen += len(message["body"])
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def _scope(headers=()) -> dict:
    return {"type": "http", "method": "POST", "path": "/", "headers": list(headers)}


async def test_streamed_body_is_cut_at_the_limit_and_the_app_never_sees_it():
    app, upload, sent = _ReadingApp(), _Upload(n=100, size=1000), []

    async def send(message):
        sent.append(message)

    await BodyLimitMiddleware(app, max_bytes=LIMIT)(_scope(), upload, send)
    assert upload.taken == 3  # the chunk that passed 2048 bytes, and not one more
    assert app.seen <= LIMIT
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 413
    assert (b"connection", b"close") in sent[0]["headers"]
    assert json.loads(sent[1]["body"])["code"] == "payload_too_large"


async def test_declared_length_is_refused_before_the_app_runs():
    app, upload, sent = _ReadingApp(), _Upload(n=1, size=10), []

    async def send(message):
        sent.append(message)

    scope = _scope([(b"content-length", str(LIMIT + 1).encode())])
    await BodyLimitMiddleware(app, max_bytes=LIMIT)(scope, upload, send)
    assert not app.called and upload.taken == 0
    assert sent[0]["status"] == 413


async def test_exactly_the_limit_passes():
    app, upload, sent = _ReadingApp(), _Upload(n=2, size=LIMIT // 2), []

    async def send(message):
        sent.append(message)

    await BodyLimitMiddleware(app, max_bytes=LIMIT)(_scope(), upload, send)
    assert app.seen == LIMIT and sent[0]["status"] == 200


def test_real_server_answers_413_before_the_upload_ends(limited_env):
    """Over a socket: send the head and 3 KB of a chunked body, keep the connection open and
    never finish; the 413 must come anyway."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_config=None, ws="none")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            for _ in range(3):
                sock.sendall(b"400\r\n" + b"x" * 0x400 + b"\r\n")
            reply = b""
            while b"\r\n\r\n" not in reply or not reply.endswith(b"}"):
                got = sock.recv(4096)
                assert got, f"connection closed without a full answer: {reply!r}"
                reply += got
        head, body = reply.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 413"), head
        assert json.loads(body)["code"] == "payload_too_large"
    finally:
        server.should_exit = True
        thread.join(15)
    assert not thread.is_alive(), "uvicorn did not stop"
