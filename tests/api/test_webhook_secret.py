"""Signing secrets. No usable default: unset, each installation makes its own, kept in Redis and
shared by every replica; a configured one is used as it is. With API keys, each key has its own,
read and rotated through /v1/webhook-secret (services/api/routes/webhook_secrets.py)."""

import asyncio
import logging
import shlex
import shutil
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from standardwebhooks import Webhook

from services.api.app import create_app
from services.api.webhooks.keyring import MAX_RETIRED
from services.api.webhooks.outbox import Outbox
from services.api.webhooks.secret import installation_secret, redis_cli
from services.devstack.redis_server import find_redis_server
from shared import names
from shared.redis_client import connect
from shared.settings import Settings, get_settings
from tests.api.conftest import WEBHOOK_SECRET


async def test_replicas_share_one_generated_secret(aredis):
    first, second = await asyncio.gather(installation_secret(aredis), installation_secret(aredis))
    assert first == second and first.startswith("whsec_")
    Webhook(first)  # well formed
    assert await aredis.ttl(names.WEBHOOK_SECRET) == -1  # kept as long as the installation
    assert first != Settings.model_fields["webhook_secret"].default


async def test_the_made_secret_is_logged_with_a_command_that_reads_it(aredis, caplog):
    # The tests' Redis is on a port of its own, as `make run`'s is: a bare `redis-cli` would
    # ask 6379, another Redis or none.
    with caplog.at_level(logging.WARNING, logger="services.api.webhooks.secret"):
        secret = await installation_secret(aredis)
    (hint,) = [r.getMessage() for r in caplog.records if "redis-cli" in r.getMessage()]
    program, *args = shlex.split(hint.split("`")[1])
    assert program == "redis-cli"
    cli = shutil.which("redis-cli") or str(Path(find_redis_server()).with_name("redis-cli"))
    read = subprocess.run([cli, *args], capture_output=True, text=True, timeout=10)
    assert read.returncode == 0 and read.stdout.strip() == secret, read


@pytest.mark.parametrize(("url", "command"), [
    ("redis://10.0.0.5:6380/0", "redis-cli -h 10.0.0.5 -p 6380"),
    ("rediss://fm:s3cret@redis.internal:6390/2",
     "redis-cli -h redis.internal -p 6390 -n 2 --tls --user fm --askpass"),
    ("redis://:s3cret@10.0.0.5/0", "redis-cli -h 10.0.0.5 -p 6379 --askpass"),
    ("unix:///run/redis/redis.sock?db=1", "redis-cli -s /run/redis/redis.sock -n 1"),
])
async def test_the_command_names_the_apis_redis_and_never_its_password(settings, url, command):
    client = connect(settings.model_copy(update={"redis_url": url}))  # as the API connects
    try:
        assert redis_cli(client) == command
    finally:
        await client.aclose()


async def test_a_secret_kept_in_redis_is_the_installations(aredis):
    await aredis.set(names.WEBHOOK_SECRET, "whsec_kept")
    assert await installation_secret(aredis) == "whsec_kept"
    assert await aredis.get(names.WEBHOOK_SECRET) == b"whsec_kept"


async def test_a_secret_deleted_as_it_is_made_is_still_returned(aredis):
    class DeletedAtOnce:
        """Redis where the secret goes (an operator's DEL) as soon as it is written."""

        async def set(self, *args, **kwargs):
            reply = await aredis.set(*args, **kwargs)
            await aredis.delete(names.WEBHOOK_SECRET)
            return reply

        def __getattr__(self, name):
            return getattr(aredis, name)

    secret = await installation_secret(DeletedAtOnce())
    assert secret.startswith("whsec_")
    Webhook(secret)


async def test_an_outbox_without_a_configured_secret_signs_with_the_installations(
    aredis, store, settings
):
    unset = settings.model_copy(update={"webhook_secret": None})
    outbox = Outbox(aredis, store, unset, "api-1")
    headers = (await outbox.keyring.signer(None)).headers("msg_1", "{}")
    secret = (await aredis.get(names.WEBHOOK_SECRET)).decode()
    Webhook(secret).verify("{}", headers)  # raises unless signed with that secret


async def test_a_configured_secret_is_used_and_nothing_is_generated(aredis, store, settings):
    outbox = Outbox(aredis, store, settings, "api-1")
    headers = (await outbox.keyring.signer(None)).headers("msg_1", "{}")
    Webhook(settings.webhook_secret).verify("{}", headers)
    assert await aredis.get(names.WEBHOOK_SECRET) is None


# GET /v1/webhook-secret and POST /v1/webhook-secret/rotate -----------------------------------

KEY_A, KEY_B = "fm-test-key-alpha", "fm-test-key-bravo"
A = {"Authorization": f"Bearer {KEY_A}"}
B = {"Authorization": f"Bearer {KEY_B}"}


@pytest.fixture
def client_for(settings_env, monkeypatch):
    def make(**env: str) -> TestClient:
        monkeypatch.setenv("FIBERMILL_WEBHOOK_SECRET", WEBHOOK_SECRET)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        get_settings.cache_clear()
        return TestClient(create_app())
    return make


def test_each_key_gets_its_own_secret_made_on_first_use_and_kept(client_for):
    with client_for(FIBERMILL_API_KEYS=f"{KEY_A},{KEY_B}") as client:
        first = client.get("/v1/webhook-secret", headers=A)
        again = client.get("/v1/webhook-secret", headers=A).json()
        other = client.get("/v1/webhook-secret", headers=B).json()
        anonymous = client.get("/v1/webhook-secret")
    assert first.status_code == 200 and first.headers["cache-control"] == "no-store"
    mine = first.json()
    assert mine == again and mine["previous"] == [] and mine["overlap_seconds"] == 24 * 3600
    assert mine["current"].startswith("whsec_")
    Webhook(mine["current"])  # well formed
    assert other["current"] != mine["current"]
    assert WEBHOOK_SECRET not in (mine["current"], other["current"])  # not the install's
    assert anonymous.status_code == 401


def test_a_rotation_keeps_the_old_secret_signing_for_the_overlap(client_for):
    with client_for(FIBERMILL_API_KEYS=f"{KEY_A},{KEY_B}",
                    FIBERMILL_WEBHOOK_SECRET_OVERLAP_SECONDS="600") as client:
        old = client.get("/v1/webhook-secret", headers=A).json()["current"]
        other = client.get("/v1/webhook-secret", headers=B).json()
        t0 = time.time()
        rotated = client.post("/v1/webhook-secret/rotate", headers=A)
        seen = client.get("/v1/webhook-secret", headers=A).json()
        assert client.get("/v1/webhook-secret", headers=B).json() == other  # B's untouched
    assert rotated.status_code == 200 and rotated.headers["cache-control"] == "no-store"
    body = rotated.json()
    assert body == seen and body["current"] not in (old, other["current"])
    (previous,) = body["previous"]
    assert previous["secret"] == old
    until = datetime.fromisoformat(previous["signs_until"]).timestamp()
    assert t0 + 600 - 60 < until < time.time() + 600 + 60


def test_rotating_in_a_loop_keeps_only_the_newest_retired_secrets(client_for):
    with client_for(FIBERMILL_API_KEYS=KEY_A) as client:
        currents = [client.post("/v1/webhook-secret/rotate", headers=A).json()["current"]
                    for _ in range(MAX_RETIRED + 3)]
        body = client.get("/v1/webhook-secret", headers=A).json()
    assert body["current"] == currents[-1]
    assert [p["secret"] for p in body["previous"]] == currents[-2:-2 - MAX_RETIRED:-1]


def test_an_open_api_shows_the_installations_secret_and_does_not_rotate_it(client_for):
    with client_for() as client:
        shown = client.get("/v1/webhook-secret")
        refused = client.post("/v1/webhook-secret/rotate")
        after = client.get("/v1/webhook-secret").json()
    assert shown.json() == after == {"current": WEBHOOK_SECRET, "previous": [],
                                     "overlap_seconds": 24 * 3600}
    assert refused.status_code == 409 and refused.json()["code"] == "not_rotatable"
    assert "FIBERMILL_WEBHOOK_SECRET" in refused.json()["detail"]
