"""Webhook signatures per the Standard Webhooks spec (https://www.standardwebhooks.com/):
`webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, one per secret
signing at the time, space-separated; a receiver accepts the message when any one of them
verifies with a secret it holds, so a rotation never leaves it with none."""

from datetime import UTC, datetime

from standardwebhooks import Webhook


class Signer:
    def __init__(self, *secrets: str) -> None:
        if not secrets:
            raise ValueError("a webhook signer needs at least one secret")
        # Decodes (and so checks) each whsec_ secret once.
        self._webhooks = [Webhook(secret) for secret in secrets]

    def headers(self, webhook_id: str, body: str, now: datetime | None = None) -> dict[str, str]:
        """The three Standard Webhooks headers for one attempt; the timestamp is the attempt's,
        so receivers' replay windows apply to retries too."""
        at = now or datetime.now(UTC)
        return {
            "webhook-id": webhook_id,
            "webhook-timestamp": str(int(at.timestamp())),
            "webhook-signature": " ".join(w.sign(webhook_id, at, body) for w in self._webhooks),
        }
