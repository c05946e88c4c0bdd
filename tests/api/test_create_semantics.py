"""Create semantics on the real app and Redis (no workers): Idempotency-Key, Prefer: wait,
deadlines, and cancel of a queued job."""

import threading
import time

import pytest
from fastapi.testclient import TestClient

from services.api.app import create_app
from tests.conftest import queued

TEXT = {"task": "text-generation", "model": "tiny-gpt2", "input": {"prompts": ["a", "b"]}}


@pytest.fixture
def client(settings_env, monkeypatch):
    monkeypatch.setenv("FIBERMILL_JANITOR_INTERVAL_SECONDS", "0.1")
    with TestClient(create_app()) as c:
        yield c


def test_same_idempotency_key_and_body_returns_the_same_job(client, redis_url):
    first = client.post("/v1/jobs", json=TEXT, headers={"Idempotency-Key": "k1"})
    again = client.post("/v1/jobs", json=TEXT, headers={"Idempotency-Key": "k1"})
    assert (first.status_code, again.status_code) == (202, 200)
    assert first.json()["id"] == again.json()["id"]
    assert queued(redis_url, "tiny-gpt2") == 2


def test_same_idempotency_key_with_another_body_is_409(client):
    assert client.post("/v1/jobs", json=TEXT, headers={"Idempotency-Key": "k2"}).status_code == 202
    other = {**TEXT, "input": {"prompts": ["c"]}}
    resp = client.post("/v1/jobs", json=other, headers={"Idempotency-Key": "k2"})
    assert resp.status_code == 409 and resp.json()["code"] == "idempotency_conflict"


def test_prefer_wait_answers_after_n_seconds_when_not_final(client):
    t0 = time.monotonic()
    resp = client.post("/v1/jobs", json=TEXT, headers={"Prefer": "wait=1"})
    elapsed = time.monotonic() - t0
    assert resp.status_code == 202 and resp.json()["status"] == "queued"
    assert resp.headers["Preference-Applied"] == "wait=1"
    assert 0.9 <= elapsed < 5


def test_prefer_wait_is_capped_at_the_server_limit(settings_env, monkeypatch):
    monkeypatch.setenv("FIBERMILL_MAX_WAIT_SECONDS", "1")
    with TestClient(create_app()) as client:
        t0 = time.monotonic()
        resp = client.post("/v1/jobs", json=TEXT, headers={"Prefer": "respond-async, wait=600"})
        assert time.monotonic() - t0 < 5
    assert resp.status_code == 202 and resp.headers["Preference-Applied"] == "wait=1"


def test_a_prefer_wait_of_thousands_of_digits_is_the_server_limit(settings_env, monkeypatch):
    monkeypatch.setenv("FIBERMILL_MAX_WAIT_SECONDS", "1")
    with TestClient(create_app()) as client:
        resp = client.post("/v1/jobs", json=TEXT, headers={"Prefer": "wait=" + "9" * 5000})
        jobs = client.get("/v1/jobs").json()["jobs"]
    assert resp.status_code == 202 and resp.headers["Preference-Applied"] == "wait=1"
    assert [j["id"] for j in jobs] == [resp.json()["id"]]  # one job, answered once


def test_an_id_this_api_never_makes_is_a_404_not_a_redis_key(client):
    job = client.post("/v1/jobs", json=TEXT).json()
    for suffix in (":webhooks", ":results", ":attempts"):
        assert client.get(f"/v1/jobs/{job['id']}{suffix}").status_code == 404
        assert client.get(f"/v1/jobs/nosuchjob{suffix}").status_code == 404
    assert client.get(f"/v1/jobs/{job['id']}").status_code == 200


def test_deadline_fails_the_job(client):
    job = client.post("/v1/jobs", json={**TEXT, "deadline_seconds": 0.3}).json()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        got = client.get(f"/v1/jobs/{job['id']}").json()
        if got["status"] != "queued":
            break
        time.sleep(0.05)
    assert got["status"] == "failed"
    assert got["error"]["code"] == "deadline_exceeded" and "0.3s" in got["error"]["message"]


def test_cancel_a_queued_job_and_cancel_again_is_a_noop(client):
    job = client.post("/v1/jobs", json=TEXT).json()
    canceled = client.post(f"/v1/jobs/{job['id']}/cancel")
    assert canceled.status_code == 200
    body = canceled.json()
    assert body["status"] == "canceled" and body["output"] == [None, None]
    again = client.post(f"/v1/jobs/{job['id']}/cancel").json()
    assert again["status"] == "canceled" and again["completed_at"] == body["completed_at"]
    assert client.post("/v1/jobs/nope/cancel").status_code == 404


def test_list_recent_jobs_newest_first(client):
    ids = [client.post("/v1/jobs", json=TEXT).json()["id"] for _ in range(3)]
    listed = client.get("/v1/jobs", params={"limit": 2}).json()["jobs"]
    assert [j["id"] for j in listed] == ids[::-1][:2]
    assert client.get("/v1/jobs", params={"limit": 0}).status_code == 422


def test_replay_is_not_refused_by_a_full_queue_and_a_too_big_job_is_422(settings_env, monkeypatch):
    monkeypatch.setenv("FIBERMILL_MAX_QUEUE_DEPTH", "2")
    with TestClient(create_app()) as client:
        first = client.post("/v1/jobs", json=TEXT, headers={"Idempotency-Key": "full"})
        assert first.status_code == 202  # the queue now holds 2: full
        assert client.post("/v1/jobs", json=TEXT).status_code == 503
        again = client.post("/v1/jobs", json=TEXT, headers={"Idempotency-Key": "full"})
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
        big = {**TEXT, "input": {"prompts": ["a", "b", "c"]}}
        resp = client.post("/v1/jobs", json=big)
        assert resp.status_code == 422 and "queues at most 2" in resp.json()["detail"][0]["msg"]


def test_prefer_wait_on_get_answers_once_the_job_is_final(client):
    job = client.post("/v1/jobs", json=TEXT).json()
    threading.Timer(0.5, lambda: client.post(f"/v1/jobs/{job['id']}/cancel")).start()
    t0 = time.monotonic()
    resp = client.get(f"/v1/jobs/{job['id']}", headers={"Prefer": "wait=10"})
    elapsed = time.monotonic() - t0
    assert resp.status_code == 200 and resp.json()["status"] == "canceled"
    assert resp.headers["Preference-Applied"] == "wait=10"
    assert 0.4 <= elapsed < 5


def test_prefer_wait_on_get_answers_after_n_seconds_when_not_final(client):
    job = client.post("/v1/jobs", json=TEXT).json()
    t0 = time.monotonic()
    resp = client.get(f"/v1/jobs/{job['id']}", headers={"Prefer": "wait=1"})
    assert 0.9 <= time.monotonic() - t0 < 5
    assert resp.status_code == 200 and resp.json()["status"] == "queued"
    assert "queue" in resp.json()


def test_get_without_prefer_answers_at_once(client):
    job = client.post("/v1/jobs", json=TEXT).json()
    t0 = time.monotonic()
    resp = client.get(f"/v1/jobs/{job['id']}")
    assert time.monotonic() - t0 < 0.5 and "Preference-Applied" not in resp.headers
