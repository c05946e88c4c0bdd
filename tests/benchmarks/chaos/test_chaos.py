"""The nemesis run of `make chaos`, short: ~100 jobs while a worker, each API replica and Redis
are killed (and Redis frozen) once each; nothing accepted may be lost, stuck, failed or wrong,
and every job gets one verified `completed` webhook. The same on Redis Sentinel: the primary
killed and the replica promoted, the old primary back as a replica, the replica frozen, a
sentinel killed and restarted. The harness's own judgement (what counts as a wrong output or a
failed run, what a schedule may do) is checked first, without a stack."""

import asyncio
import json
from datetime import UTC, datetime

import httpx
import numpy as np
import pytest
from standardwebhooks import Webhook

from benchmarks.chaos import faults as chaos_faults
from benchmarks.chaos import run as chaos
from benchmarks.chaos.faults import FAILOVER_KINDS, KINDS, PROFILE_KINDS, FaultRunner, Logged, Step
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


@pytest.mark.parametrize(("profile", "failovers"), [("failover", 2), ("failover-short", 1)])
def test_every_failover_profile_injects_every_kind_and_its_failovers(profile, failovers):
    steps = chaos_faults.PROFILES[profile](360.0 if profile == "failover" else None)
    assert PROFILE_KINDS[profile] is FAILOVER_KINDS
    assert {a for acts in FAILOVER_KINDS.values() for a in acts} <= {s.action for s in steps}
    assert [s.at for s in steps] == sorted(s.at for s in steps)
    kills = [s.at for s in steps if s.action == "kill_primary"]
    backs = [s.at for s in steps if s.action == "restart_old_primary"]
    assert len(kills) == len(backs) == failovers
    # Back as a replica ~5 s after the kill: well within the 20 s a write waits for a replica.
    assert all(0 < b - k <= 6 for k, b in zip(kills, backs, strict=True))
    if profile == "failover":
        assert sum(s.action == "kill_worker" for s in steps) >= 40  # one every ~8 s
        assert kills[1] - backs[0] > 60  # the second failover well after the first


@pytest.mark.parametrize("profile", ["failover", "failover-short"])
def test_the_replica_is_never_paused_while_a_primary_is_down(profile):
    """With one replica, the only node left while the old primary is down is the new primary:
    pausing it would stop every write, and pausing the replica before the sentinels promote it
    would leave them no one to promote. The margin allows for the kill step lasting until the
    failover and the restart until the node synced."""
    steps = chaos_faults.PROFILES[profile](360.0 if profile == "failover" else None)
    down = list(zip([s.at for s in steps if s.action == "kill_primary"],
                    [s.at for s in steps if s.action == "restart_old_primary"], strict=True))
    paused = list(zip([s.at for s in steps if s.action == "pause_replica"],
                      [s.at for s in steps if s.action == "resume_replica"], strict=True))
    assert paused
    for p0, p1 in paused:
        assert p0 < p1
        for d0, d1 in down:
            assert p1 < d0 or p0 > d1 + 5, (p0, p1, d0, d1)


class _NoStack:
    failovers: list = []


def test_a_failover_profile_run_without_the_failovers_misses_them():
    steps = chaos_faults.failover_short()
    runner = FaultRunner(_NoStack(), steps, 0.0, FAILOVER_KINDS)  # type: ignore[arg-type]
    runner.log = [Logged(s.at, s, "done", True) for s in steps]
    assert runner.missing_kinds() == ["failovers (0 of 1 seen)"]


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


@pytest.mark.e2e
@pytest.mark.timeout(420)
def test_short_failover_run_loses_nothing(model_dir, tmp_path):
    result = chaos.run(chaos.ChaosConfig(
        registry=model_dir / "registry.yaml", jobs=100, profile="failover-short", combos=20,
        workdir=tmp_path))
    table = result.markdown()
    print(table)
    assert not result.missing_fault_kinds, table
    assert result.accepted == 100, table
    assert {k: getattr(result, k) for k in FAILING} == dict.fromkeys(FAILING, 0), table
    assert len(result.failovers) == 1, table
    assert all(f.new_port != f.old_port for f in result.failovers), table
