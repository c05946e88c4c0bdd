"""A caller's rate limit as the job store takes from it: a token bucket in Redis."""

import math
from dataclasses import dataclass

from shared.errors import RateLimited


@dataclass(frozen=True)
class TokenBucket:
    key: str
    rate: float  # tokens per second
    burst: int

    def refusal(self, wait: float) -> RateLimited:
        """The error for a submission refused `wait` seconds before a token is back."""
        retry_after = max(1, math.ceil(wait))
        return RateLimited(
            f"rate limit of {self.rate * 60:g} job submissions per minute (burst {self.burst}) "
            f"reached; retry in {retry_after}s",
            retry_after=retry_after,
        )
