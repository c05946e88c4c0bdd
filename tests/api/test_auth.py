"""API keys on the real app: /v1 needs a known Bearer key, health and docs stay open, and a key
sees only its own jobs."""

import hashlib
import logging

import pytest
from fastapi.testclient import TestClient

from services.api.app import create_app
from services.api.auth import Principal, configured_digests, identify, key_id
from shared.settings import Settings, get_settings

KEY_A = "fm-test-key-alpha"
KEY_B = "fm-test-key-bravo"
TEXT = {"task": "text-generation", "model": "tiny-gpt2", "input": {"prompts": ["hi"]}}


def _bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def client(settings_env, monkeypatch):
    # Key B is configured by its digest only, as a deployment that keeps no raw keys would.
    digest_b = hashlib.sha256(KEY_B.encode()).hexdigest()
    monkeypatch.setenv("FIBERMILL_API_KEYS", f"{KEY_A}, sha256:{digest_b}")
    get_settings.cache_clear()
    with TestClient(create_app()) as c:
        yield c


@pytest.fixture
def open_client(settings_env, monkeypatch):
    monkeypatch.delenv("FIBERMILL_API_KEYS", raising=False)
    get_settings.cache_clear()
    with TestClient(create_app()) as c:
        yield c


@pytest.mark.parametrize("headers", [{}, _bearer("wrong"), {"Authorization": f"Basic {KEY_A}"}])
@pytest.mark.parametrize(("method", "path"), [("post", "/v1/jobs"), ("get", "/v1/models"),
                                              ("get", "/v1/jobs/0123")])
def test_v1_without_a_known_key_is_401(client, headers, method, path):
    kwargs = {"json": TEXT} if method == "post" else {}
    resp = getattr(client, method)(path, headers=headers, **kwargs)
    assert resp.status_code == 401, resp.text
    assert resp.headers["WWW-Authenticate"] == "Bearer"
    assert resp.json()["code"] == "unauthorized"


def test_v1_with_a_known_key_works(client):
    for key in (KEY_A, KEY_B):
        assert client.post("/v1/jobs", json=TEXT, headers=_bearer(key)).status_code == 202
        assert client.get("/v1/models", headers=_bearer(key)).status_code == 200


def test_health_metrics_and_docs_stay_open(client):
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 503  # open, just no worker in these tests
    assert client.get("/metrics").status_code == 200
    assert client.get("/docs").status_code == 200
    spec = client.get("/openapi.json")
    assert spec.status_code == 200
    assert "HTTPBearer" in spec.json()["components"]["securitySchemes"]


def test_a_key_cannot_see_another_keys_job(client):
    job = client.post("/v1/jobs", json=TEXT, headers=_bearer(KEY_A)).json()
    own = client.get(f"/v1/jobs/{job['id']}", headers=_bearer(KEY_A))
    assert own.status_code == 200 and own.json()["id"] == job["id"]
    for path in (f"/v1/jobs/{job['id']}", f"/v1/jobs/{job['id']}/outputs/0"):
        other = client.get(path, headers=_bearer(KEY_B))
        assert other.status_code == 404 and other.json()["code"] == "not_found"


def test_open_api_needs_no_key(open_client):
    job = open_client.post("/v1/jobs", json=TEXT)
    assert job.status_code == 202
    assert open_client.get(f"/v1/jobs/{job.json()['id']}").status_code == 200


def test_keys_are_known_by_digest_and_never_logged(client, caplog):
    caplog.set_level(logging.DEBUG)
    client.post("/v1/jobs", json=TEXT, headers=_bearer(KEY_A))
    client.post("/v1/jobs", json=TEXT, headers=_bearer(KEY_A + "x"))
    assert not [r for r in caplog.records if KEY_A in r.getMessage()]
    digests = configured_digests(get_settings())
    assert all(len(d) == 64 and KEY_A not in d for d in digests)
    assert identify(KEY_A, digests) == key_id(hashlib.sha256(KEY_A.encode()).hexdigest())
    assert len(identify(KEY_A, digests)) == 16
    assert identify(KEY_B, digests) != identify(KEY_A, digests)
    assert identify("nope", digests) is None
    assert configured_digests(Settings(api_keys=" , ")) == []


def test_principal_identity_is_the_key_not_the_address():
    assert Principal("k", "10.0.0.1") == Principal("k", "10.0.0.2")
    assert Principal(None) == Principal(None, "10.0.0.1")
