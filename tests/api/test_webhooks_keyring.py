"""Each API key's webhook signing secrets, on the tests' real Redis: made once on first use,
rotated with an overlap timed by Redis's clock, and the installation's one for an open API."""

import asyncio
import time

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from services.api.webhooks.keyring import Keyring
from shared import names
from shared.errors import WebhookSecretNotRotatable
from tests.api.conftest import WEBHOOK_SECRET


@pytest.fixture
def keyring(aredis, settings) -> Keyring:
    return Keyring(aredis, settings.model_copy(update={"webhook_secret_overlap_seconds": 600}))


async def test_replicas_making_a_keys_first_secret_at_once_make_one(aredis, settings):
    replicas = [Keyring(aredis, settings) for _ in range(4)]
    found = await asyncio.gather(*(k.secrets("key-a") for k in replicas))
    assert all(f == found[0] for f in found)
    (only,) = found[0]
    assert only.signs_until is None and only.secret.startswith("whsec_")
    assert only.secret != WEBHOOK_SECRET
    assert await aredis.zcard(names.webhook_secrets_key("key-a")) == 1


async def test_keys_have_different_secrets(keyring):
    a, b = await keyring.secrets("key-a"), await keyring.secrets("key-b")
    assert a[0].secret != b[0].secret


async def test_during_the_overlap_both_secrets_sign(keyring):
    (old,) = await keyring.secrets("key-a")
    rotated = await keyring.rotate("key-a")
    assert [s.secret for s in rotated][1:] == [old.secret]
    assert rotated[0].signs_until is None
    assert time.time() + 500 < rotated[1].signs_until < time.time() + 700
    headers = (await keyring.signer("key-a")).headers("msg_1", "{}")
    assert len(headers["webhook-signature"].split(" ")) == 2
    for live in rotated:
        Webhook(live.secret).verify("{}", headers)


async def test_no_overlap_retires_the_old_secret_at_once(aredis, settings):
    keyring = Keyring(aredis, settings.model_copy(update={"webhook_secret_overlap_seconds": 0}))
    (old,) = await keyring.secrets("key-a")
    (new,) = await keyring.rotate("key-a")
    headers = (await keyring.signer("key-a")).headers("msg_1", "{}")
    Webhook(new.secret).verify("{}", headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(old.secret).verify("{}", headers)


async def test_the_overlap_is_timed_by_redis_not_the_api_hosts_clock(keyring, monkeypatch):
    await keyring.secrets("key-a")
    await keyring.rotate("key-a")
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)  # a replica an hour fast
    assert len(await keyring.secrets("key-a")) == 2


async def test_an_open_api_signs_with_the_installations_secret_and_does_not_rotate(keyring):
    assert [s.secret for s in await keyring.secrets(None)] == [WEBHOOK_SECRET]
    with pytest.raises(WebhookSecretNotRotatable, match="FIBERMILL_WEBHOOK_SECRET"):
        await keyring.rotate(None)
