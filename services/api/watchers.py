"""A bound on the long-lived watches one API replica holds: live event streams and
`Prefer: wait` answers.

Each watch costs the replica little (one shared pub/sub connection serves them all, see
services/api/events.py) but not nothing: a listener, a task, a socket, and a read of the job on
every wake. Without a bound, one caller opening thousands of streams would slow every other
caller's. So a replica holds at most `max_watches` in all and `max_watches_per_caller` per API
key (per client address on an open API). A stream past either bound is refused with 429 and
Retry-After; a `Prefer: wait` past it is not waited on: the job is answered at once, as created
(RFC 7240 lets a server ignore a preference), so no accepted job is ever answered with an error.
"""

import contextlib
from collections import Counter
from collections.abc import Iterator

from shared.errors import RateLimited

RETRY_AFTER_SECONDS = 5


class TooManyWatches(RateLimited):
    code = "too_many_watches"

    def __init__(self, message: str) -> None:
        super().__init__(message, retry_after=RETRY_AFTER_SECONDS)


class Watchers:
    def __init__(self, max_watches: int, max_per_caller: int) -> None:
        self.max_watches = max_watches
        self.max_per_caller = max_per_caller
        self.by_caller: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return self.by_caller.total()

    def refusal(self, caller: str) -> str | None:
        """Why one more watch for `caller` is refused, or None when it may open."""
        if self.total >= self.max_watches:
            return (f"this API replica already holds its limit of {self.max_watches} live "
                    "streams and waits (FIBERMILL_MAX_WATCHES); retry shortly")
        if self.by_caller[caller] >= self.max_per_caller:
            return (f"at most {self.max_per_caller} live streams and waits per API key and "
                    "replica (FIBERMILL_MAX_WATCHES_PER_CALLER); close one or retry shortly")
        return None

    @contextlib.contextmanager
    def hold(self, caller: str, checked: bool = False) -> Iterator[None]:
        """Hold a watch for `caller` while the block runs; TooManyWatches past a bound, unless
        the caller `checked` (`refusal`) already, answering the request with it."""
        if not checked and (why := self.refusal(caller)) is not None:
            raise TooManyWatches(why)
        self.by_caller[caller] += 1
        try:
            yield
        finally:
            self.by_caller[caller] -= 1
            if self.by_caller[caller] <= 0:
                del self.by_caller[caller]
