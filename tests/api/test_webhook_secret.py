"""No usable default signing secret: unset, each installation makes its own, kept in Redis and
shared by every replica; a configured one is used as it is."""

import asyncio

from standardwebhooks import Webhook

from services.api.webhooks.outbox import Outbox
from services.api.webhooks.secret import installation_secret
from shared import names
from shared.settings import Settings


async def test_replicas_share_one_generated_secret(aredis):
    first, second = await asyncio.gather(installation_secret(aredis), installation_secret(aredis))
    assert first == second and first.startswith("whsec_")
    Webhook(first)  # well formed
    assert await aredis.ttl(names.WEBHOOK_SECRET) == -1  # kept as long as the installation
    assert first != Settings.model_fields["webhook_secret"].default


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
    task = asyncio.create_task(outbox.run())
    try:
        for _ in range(200):
            if outbox.signer is not None:
                break
            await asyncio.sleep(0.01)
        secret = (await aredis.get(names.WEBHOOK_SECRET)).decode()
        headers = outbox.signer.headers("msg_1", "{}")
        Webhook(secret).verify("{}", headers)  # raises unless signed with that secret
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_configured_secret_is_used_and_nothing_is_generated(aredis, store, settings):
    outbox = Outbox(aredis, store, settings, "api-1")
    Webhook(settings.webhook_secret).verify("{}", outbox.signer.headers("msg_1", "{}"))
    assert await aredis.get(names.WEBHOOK_SECRET) is None
