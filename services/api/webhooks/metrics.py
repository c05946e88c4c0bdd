"""Webhook delivery metrics."""

from prometheus_client import Counter

# delivered, failed and dropped count deliveries once each, when they end; retrying counts each
# attempt that will be tried again.
DELIVERIES = Counter(
    "fibermill_webhook_deliveries", "Webhook delivery outcomes", ["outcome"]
)
OUTCOMES = ("delivered", "retrying", "failed", "dropped")
for _outcome in OUTCOMES:  # exported at 0 from the start, so rate() and alerts see them
    DELIVERIES.labels(outcome=_outcome)
