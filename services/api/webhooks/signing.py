"""Webhook signatures per the Standard Webhooks spec (https://www.standardwebhooks.com/):
`webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`."""

from datetime import UTC, datetime

from standardwebhooks import Webhook


class Signer:
    def __init__(self, secret: str) -> None:
        self._webhook = Webhook(secret)  # decodes (and so checks) the whsec_ secret once

    def headers(self, webhook_id: str, body: str, now: datetime | None = None) -> dict[str, str]:
        """The three Standard Webhooks headers for one attempt; the timestamp is the attempt's,
        so receivers' replay windows apply to retries too."""
        at = now or datetime.now(UTC)
        return {
            "webhook-id": webhook_id,
            "webhook-timestamp": str(int(at.timestamp())),
            "webhook-signature": self._webhook.sign(webhook_id, at, body),
        }
