"""GET /v1/usage on the real app and Redis: a key sees its own usage only, per model and UTC
day; tokens come from a real worker's results; the range is checked, each problem naming its
query parameter."""

import hashlib
from datetime import UTC, date, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from services.api.app import create_app
from shared.settings import get_settings
from tests.api.worker_process import wait_for, wait_until_ready, worker_process

KEY_A = "fm-usage-key-alpha"
KEY_B = "fm-usage-key-bravo"
FINAL = {"succeeded", "failed", "canceled"}


def _bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def _key_id(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _text(prompts: list[str]) -> dict:
    return {"model": "tiny-gpt2", "input": {"prompts": prompts, "max_new_tokens": 5}}


@pytest.fixture
def keyed(settings_env, monkeypatch):
    monkeypatch.setenv("FIBERMILL_API_KEYS", f"{KEY_A},{KEY_B}")
    get_settings.cache_clear()
    with TestClient(create_app()) as c:
        yield c


@pytest.fixture
def open_client(settings_env, monkeypatch):
    monkeypatch.delenv("FIBERMILL_API_KEYS", raising=False)
    get_settings.cache_clear()
    with TestClient(create_app()) as c:
        yield c


def _today(redis_url: str) -> date:
    import redis

    with redis.Redis.from_url(redis_url) as r:
        seconds, _ = r.time()
    return datetime.fromtimestamp(seconds, UTC).date()


def test_each_key_sees_its_own_tokens_and_jobs(keyed, redis_url, model_dir, tmp_path):
    a = [keyed.post("/v1/jobs", json=_text(p), headers=_bearer(KEY_A)).json()["id"]
         for p in (["Return the", "This module"], ["Open the"])]
    b = keyed.post("/v1/jobs", json=_text(["The sun"]), headers=_bearer(KEY_B)).json()["id"]
    # No worker serves digits: this one is canceled while queued.
    b_canceled = keyed.post("/v1/jobs", json={"model": "digits", "input": {"prompts": ["3"]}},
                            headers=_bearer(KEY_B)).json()["id"]
    assert keyed.post(f"/v1/jobs/{b_canceled}/cancel",
                      headers=_bearer(KEY_B)).json()["status"] == "canceled"
    log = tmp_path / "workers.log"
    with worker_process(redis_url, model_dir, tmp_path / "blobs", "tiny-gpt2", log) as proc:
        wait_until_ready(keyed, proc, log)
        done_a = [wait_for(keyed, i, FINAL, _bearer(KEY_A)) for i in a]
        done_b = wait_for(keyed, b, FINAL, _bearer(KEY_B))
    assert [j["status"] for j in [*done_a, done_b]] == ["succeeded"] * 3
    today = _today(redis_url).isoformat()

    usage_a = keyed.get("/v1/usage", headers=_bearer(KEY_A)).json()
    outs = [o for j in done_a for o in j["output"]]
    assert usage_a["key"] == _key_id(KEY_A)
    assert usage_a["end"] == today
    (row,) = usage_a["data"]
    assert (row["day"], row["model"]) == (today, "tiny-gpt2")
    assert row["completion_tokens"] == sum(o["tokens"] for o in outs) > 0
    assert row["prompt_tokens"] == sum(o["prompt_tokens"] for o in outs) > 0
    assert row["images"] == 0 and row["device_seconds"] > 0
    assert row["jobs"] == {"canceled": 0, "failed": 0, "succeeded": 2}
    assert usage_a["totals"] == {k: v for k, v in row.items() if k not in ("day", "model")}

    usage_b = keyed.get("/v1/usage", headers=_bearer(KEY_B)).json()
    assert usage_b["key"] == _key_id(KEY_B)
    rows = {r["model"]: r for r in usage_b["data"]}
    assert set(rows) == {"digits", "tiny-gpt2"}
    assert rows["tiny-gpt2"]["completion_tokens"] == done_b["output"][0]["tokens"]
    assert rows["tiny-gpt2"]["jobs"]["succeeded"] == 1
    assert rows["digits"]["jobs"] == {"canceled": 1, "failed": 0, "succeeded": 0}
    assert rows["digits"]["device_seconds"] == 0 and rows["digits"]["images"] == 0
    assert usage_b["totals"]["jobs"] == {"canceled": 1, "failed": 0, "succeeded": 1}

    # A range that ends before today holds none of it.
    yesterday = (date.fromisoformat(today) - timedelta(days=1)).isoformat()
    past = keyed.get("/v1/usage", params={"end": yesterday}, headers=_bearer(KEY_A)).json()
    assert past["data"] == [] and past["totals"]["completion_tokens"] == 0


def test_the_open_api_has_one_tenant(open_client, redis_url):
    job = open_client.post("/v1/jobs", json={"model": "digits",
                                             "input": {"prompts": ["3"]}}).json()
    open_client.post(f"/v1/jobs/{job['id']}/cancel")
    usage = open_client.get("/v1/usage").json()
    assert usage["key"] is None
    today = _today(redis_url)
    assert (usage["start"], usage["end"]) == ((today - timedelta(days=29)).isoformat(),
                                              today.isoformat())
    assert [(r["model"], r["jobs"]["canceled"]) for r in usage["data"]] == [("digits", 1)]


def test_usage_needs_a_key_when_keys_are_on(keyed):
    assert keyed.get("/v1/usage").status_code == 401
    assert keyed.get("/v1/usage", headers=_bearer("wrong")).status_code == 401


@pytest.mark.parametrize(("params", "field", "words"), [
    ({"start": "yesterday"}, "start", "valid date"),
    ({"end": "2026-13-01"}, "end", "valid date"),
    ({"start": "2026-03-02", "end": "2026-03-01"}, "start", "on or before end"),
    ({"start": "2025-01-01", "end": "2026-03-01"}, "end", "at most 400 days"),
])
def test_a_bad_range_is_a_422_naming_its_parameter(open_client, params, field, words):
    resp = open_client.get("/v1/usage", params=params)
    assert resp.status_code == 422, resp.text
    (problem,) = resp.json()["detail"]
    assert problem["loc"] == ["query", field]
    assert words in problem["msg"]


def test_a_range_as_long_as_the_retention_is_accepted(open_client):
    resp = open_client.get("/v1/usage", params={"start": "2025-01-01", "end": "2026-02-04"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["data"] == []
