"""When to try a webhook again: exponential backoff with full jitter, and Retry-After."""

import random
import time
from email.utils import parsedate_to_datetime


def backoff(attempt: int, base: float, cap: float) -> float:
    """Seconds to wait after failed attempt number `attempt` (1-based): uniform in
    [0, min(cap, base * 2**(attempt-1))], so replicas and receivers coming back up are not hit
    by every sender at once."""
    ceiling = min(cap, base * 2 ** min(attempt - 1, 32))
    return random.uniform(0, ceiling)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds a Retry-After header asks for (delta-seconds or HTTP-date), None if absent or
    unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # HTTP-dates are GMT
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
