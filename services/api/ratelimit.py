"""Job submissions per API key: a token bucket in Redis, shared by every API replica.

A submission takes its token in the step that stores its job (`JobStore.create`), so the limit
costs no round trip of its own, and a request refused for another reason (invalid, an overfull
queue, an Idempotency-Key replay) takes none.
"""

from services.api.auth import Principal
from shared.names import ratelimit_key
from shared.settings import Settings
from shared.token_bucket import TokenBucket


def bucket_key(principal: Principal) -> str:
    if principal.key_id is not None:
        who = f"key:{principal.key_id}"
    elif principal.client:
        who = f"ip:{principal.client}"
    else:
        who = "anonymous"
    return ratelimit_key(who)


class RateLimiter:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def bucket(self, principal: Principal) -> TokenBucket:
        """The caller's bucket, for `Submissions.submit` to take its token from."""
        return TokenBucket(bucket_key(principal), self.settings.rate_limit_per_minute / 60.0,
                           self.settings.rate_limit_burst)
