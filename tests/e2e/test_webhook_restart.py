"""A `completed` webhook survives a receiver that is down for 20 s and an API restart."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import redis
from standardwebhooks import Webhook

from services.devstack.processes import start_api, stop
from services.devstack.redis_server import free_port

pytestmark = pytest.mark.e2e

SECRET = "whsec_" + "dGVzdHMgb2YgZmliZXJtaWxsIHdlYmhvb2tz"  # tests only


class Receiver:
    def __init__(self, port: int) -> None:
        self.received: list[tuple[dict, bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"]))
                outer.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_completed_webhook_survives_receiver_down_and_api_restart(redis_url, model_dir,
                                                                  tmp_path):
    env = {
        "FIBERMILL_WEBHOOK_SECRET": SECRET,
        "FIBERMILL_REDIS_URL": redis_url,
        "FIBERMILL_MODEL_REGISTRY": str(model_dir / "registry.yaml"),
        "FIBERMILL_WEBHOOK_ALLOW_PRIVATE": "true",
        "FIBERMILL_WEBHOOK_BACKOFF_BASE_SECONDS": "0.5",
        "FIBERMILL_WEBHOOK_BACKOFF_CAP_SECONDS": "4",
    }
    hook_port, api_port = free_port(), free_port()
    base = f"http://127.0.0.1:{api_port}"
    log = open(tmp_path / "api.log", "w")  # noqa: SIM115 - closed below
    api = start_api(api_port, env, stdout=log, stderr=log)
    receiver = None
    try:
        _wait_up(base)
        job = httpx.post(f"{base}/v1/jobs", json={
            "task": "text-generation", "model": "tiny-gpt2", "input": {"prompts": ["x"]},
            "webhook": f"http://127.0.0.1:{hook_port}/hook"}).json()
        # No worker runs: canceling makes the job final, and canceled jobs get `completed` too.
        assert httpx.post(f"{base}/v1/jobs/{job['id']}/cancel").json()["status"] == "canceled"
        down_since = time.monotonic()
        time.sleep(3)
        stop([api])  # the API restarts while the receiver is still down
        api = start_api(api_port, env, stdout=log, stderr=log)
        _wait_up(base)
        time.sleep(max(0.0, 20 - (time.monotonic() - down_since)))
        attempts_while_down = httpx.get(f"{base}/v1/jobs/{job['id']}").json()
        receiver = Receiver(hook_port)
        deadline = time.monotonic() + 30
        while not receiver.received and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)  # room for a wrong second delivery to show up
        assert len(receiver.received) == 1, attempts_while_down
        headers, body = receiver.received[0]
        Webhook(SECRET).verify(body, headers)  # raises on a bad signature
        payload = json.loads(body)
        assert payload["id"] == job["id"] and payload["status"] == "canceled"
        deliveries = httpx.get(f"{base}/v1/jobs/{job['id']}").json()["webhook_deliveries"]
        assert len(deliveries) >= 3 and deliveries[-1]["status_code"] == 204
        assert {d["webhook_id"] for d in deliveries} == {headers["webhook-id"]}
        assert all(d["error"] for d in deliveries[:-1])
    finally:
        stop([api])
        log.close()
        if receiver:
            receiver.close()
        redis.Redis.from_url(redis_url).flushdb()


def _wait_up(base: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/healthz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{base} did not come up")
