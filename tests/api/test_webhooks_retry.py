"""Retry timing and signatures of webhook attempts."""

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from services.api.webhooks.retry import backoff, parse_retry_after
from services.api.webhooks.sender import judge
from services.api.webhooks.signing import Signer

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def test_backoff_is_jittered_doubling_and_capped():
    for attempt, ceiling in ((1, 1.0), (2, 2.0), (3, 4.0), (9, 300.0), (500, 300.0)):
        delays = [backoff(attempt, 1.0, 300.0) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling / 2 and len(set(delays)) > 100


def test_retry_after_seconds_and_date():
    now = datetime(2030, 1, 1, tzinfo=UTC)
    assert parse_retry_after("7") == 7.0
    later = format_datetime(now + timedelta(seconds=30), usegmt=True)
    assert parse_retry_after(later, now=now.timestamp()) == pytest.approx(30)
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None


@pytest.mark.parametrize(("status", "verdict"), [
    (200, "delivered"), (204, "delivered"), (301, "retry"), (307, "retry"), (429, "retry"),
    (500, "retry"), (503, "retry"), (400, "final"), (401, "final"), (404, "final"),
    (410, "final"),
])
def test_status_verdicts(status, verdict):
    assert judge(status, None).verdict == verdict


def test_signature_verifies_with_standardwebhooks():
    body = '{"id":"j1","status":"succeeded"}'
    headers = Signer(SECRET).headers("msg_j1_completed", body)
    assert Webhook(SECRET).verify(body, headers) == {"id": "j1", "status": "succeeded"}
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(body.replace("succeeded", "failed"), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(body, {**headers, "webhook-id": "msg_other"})
