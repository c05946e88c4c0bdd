"""The nemesis run of `make chaos`, short: ~100 jobs while a worker, each API replica and Redis
are killed (and Redis frozen) once each; nothing accepted may be lost, stuck, failed or wrong,
and every job gets one verified `completed` webhook. The harness's own judgement (what counts
as a wrong output or a failed run) is checked first, without a stack."""

import asyncio
import json
from datetime import UTC, datetime

import httpx
import numpy as np
import pytest
from standardwebhooks import Webhook

from benchmarks.chaos import faults as chaos_faults
from benchmarks.chaos import run as chaos
from benchmarks.chaos.faults import KINDS, Logged, Step
from benchmarks.chaos.jobs import combos, same_outputs
from benchmarks.chaos.receiver import Receiver, judge_webhooks
from benchmarks.chaos.report import FAILING, ChaosResult
from services.devstack.redis_server import free_port

SECRET = "whsec_" + "dGVzdHMgb2YgZmliZXJtaWxsIGNoYW9z"  # tests only


def test_outputs_must_match_exactly_or_within_one_pixel_level():
    img = np.full((16, 16), 100)
    assert same_outputs(["a", img], ["a", img + 1])
    assert not same_outputs(["a", img], ["a", img + 2])
    assert not same_outputs(["a", img], ["b", img])
    assert not same_outputs(["a", img], ["a"])
    assert not same_outputs([img], [np.full((8, 8), 100)])


def test_combos_are_seeded_distinct_and_alternate_tasks():
    bodies = combos(20, 3, "tiny-gpt2", "digits", 12)
    assert bodies == combos(20, 3, "tiny-gpt2", "digits", 12)
    assert len({b["input"]["seed"] for b in bodies}) == 20
    assert [b["task"] for b in bodies[:2]] == ["text-generation", "image-generation"]
    assert all(len(b["input"]["prompts"]) == 2 for b in bodies)


@pytest.mark.parametrize("profile", ["full", "short"])
def test_every_profile_injects_every_kind_of_fault(profile):
    steps = chaos_faults.PROFILES[profile]()
    actions = {s.action for s in steps}
    assert {a for acts in KINDS.values() for a in acts} <= actions
    assert [s.at for s in steps] == sorted(s.at for s in steps)
    killed, started = [s.at for s in steps if s.action == "kill_redis"], \
        [s.at for s in steps if s.action == "start_redis"]
    assert any(k < s.at < r for s in steps if s.note == "while Redis is down"
               for k, r in zip(killed, started, strict=True))


def test_any_failing_count_fails_the_run_and_a_skipped_kill_is_no_fault():
    r = ChaosResult("short", 10, 2)
    assert r.ok
    for name in FAILING:
        setattr(r, name, 1)
        assert not r.ok and r.failures() == {name: 1}
        assert "FAIL" in r.markdown()
        setattr(r, name, 0)
    r.submit_conn_errors = 5  # informational: an API replica was killed on purpose
    assert r.ok
    assert not Logged(1.0, Step(1, "kill_worker"), "skipped: no worker", True).injected


def _post(url: str, secret: str, job: dict, event: str = "completed") -> None:
    body = json.dumps(job)
    webhook_id = f"msg_{job['id']}_{event}"
    headers = {"content-type": "application/json", **_sign(secret, webhook_id, body)}
    assert httpx.post(url, content=body, headers=headers).status_code == 204


def _sign(secret: str, webhook_id: str, body: str) -> dict[str, str]:
    now = datetime.now(UTC)
    return {"webhook-id": webhook_id, "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": Webhook(secret).sign(webhook_id, now, body)}


def test_webhook_verdicts_missing_unverified_conflicting_and_duplicates():
    receiver = Receiver(free_port(), SECRET)
    final = {j: {"id": j, "status": "succeeded", "output": [{"text": j}], "error": None}
             for j in ("ok", "twice", "forged", "contradicts", "silent")}
    try:
        _post(receiver.url, SECRET, final["ok"])
        _post(receiver.url, SECRET, final["twice"])
        _post(receiver.url, SECRET, final["twice"])  # at-least-once: the same delivery again
        _post(receiver.url, "whsec_" + "b3RoZXIgc2VjcmV0IGZvciB0ZXN0cw==", final["forged"])
        _post(receiver.url, SECRET, {**final["contradicts"], "status": "failed"})
        result = ChaosResult("short", 5, 1)
        asyncio.run(judge_webhooks(receiver, final, result, grace=0))
    finally:
        receiver.close()
    assert result.webhooks_unverified == 1
    assert result.webhooks_missing == 2  # "forged" (unverified) and "silent"
    assert result.webhooks_conflicting == 1
    assert result.webhook_duplicates == 1


@pytest.mark.e2e
@pytest.mark.timeout(420)
def test_short_chaos_run_loses_nothing(model_dir, tmp_path):
    result = chaos.run(chaos.ChaosConfig(
        registry=model_dir / "registry.yaml", jobs=100, profile="short", combos=20,
        workdir=tmp_path))
    table = result.markdown()
    print(table)  # `pytest -rP` shows it for a passing run too
    assert not result.missing_fault_kinds, table
    assert result.accepted == 100, table
    assert {k: getattr(result, k) for k in FAILING} == dict.fromkeys(FAILING, 0), table
