"""Fixtures for the API's background parts, on the tests' real Redis."""

import pytest

from services.api.dispatch import Dispatcher
from shared.celery_config import make_celery
from shared.registry import load_registry
from shared.settings import Settings

WEBHOOK_SECRET = "whsec_" + "dGVzdHMgb2YgZmliZXJtaWxsIHdlYmhvb2tz"  # tests only


@pytest.fixture
def settings(redis_url, model_dir) -> Settings:
    return Settings(
        redis_url=redis_url,
        model_registry=model_dir / "registry.yaml",
        joiner_claim_idle_seconds=0.05,
        webhook_secret=WEBHOOK_SECRET,
        joiner_block_ms=50,
        max_attempts=2,
    )


@pytest.fixture
def dispatcher(settings):
    celery = make_celery(settings)
    yield Dispatcher(celery, load_registry(settings.model_registry))
    celery.close()


@pytest.fixture
def lifecycle(store, aredis, settings):
    from services.api.lifecycle import Lifecycle
    from services.api.notify import Notifier
    from services.api.webhooks.outbox import Outbox

    outbox = Outbox(aredis, store, settings, "test-api")
    return Lifecycle(store, Notifier(aredis, outbox, ""), "")
