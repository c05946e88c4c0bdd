"""Per-device buffer pools: device (and pinned host) memory allocated once, leased per batch.

A pool is keyed by shape bucket: `(capacity, *shape)`, where capacity is the batch size rounded
up to a power of two and shape is what else fixes the buffers' sizes (latent height and width,
or KV-cache length). At worker start each configured bucket gets `sets_per_bucket` sets. A
lease hands out a free set and takes it back in `finally` (on error and cancellation too).
When a bucket has no free set, one is allocated for this lease alone, counted as `adhoc`, and
dropped afterwards: the pool never grows past what was configured, unlike a pool that keeps
whatever peak concurrency once made it allocate.
"""

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from services.worker import metrics

BucketKey = tuple[int, ...]


def capacity(n: int) -> int:
    """The batch capacity bucket for `n` items: the next power of two."""
    if n < 1:
        raise ValueError("a batch has at least one item")
    return 1 << (n - 1).bit_length()


class BufferSet(dict[str, Any]):
    """Named buffers of one bucket (tensors, or objects that own tensors such as a KV cache)."""

    def __init__(self, key: BucketKey, buffers: dict[str, Any], adhoc: bool = False) -> None:
        super().__init__(buffers)
        self.key = key
        self.adhoc = adhoc


class BufferPool:
    def __init__(
        self,
        model: str,
        allocate: Callable[[BucketKey], dict[str, Any]],
        buckets: Iterable[BucketKey] = (),
        sets_per_bucket: int = 2,
    ) -> None:
        self.model = model
        self._allocate = allocate
        self._lock = threading.Lock()
        self._free: dict[BucketKey, list[BufferSet]] = defaultdict(list)
        self._pooled: dict[BucketKey, int] = defaultdict(int)
        self.adhoc_live = 0
        for key in buckets:
            for _ in range(sets_per_bucket):
                self._free[key].append(BufferSet(key, allocate(key)))
                self._pooled[key] += 1
        self._publish()

    @property
    def pooled_sets(self) -> int:
        return sum(self._pooled.values())

    @property
    def free_sets(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._free.values())

    def buckets(self) -> list[BucketKey]:
        return sorted(self._pooled)

    @contextmanager
    def lease(self, key: BucketKey) -> Iterator[BufferSet]:
        with self._lock:
            free = self._free.get(key)
            buffers = free.pop() if free else None
            if buffers is None:
                self.adhoc_live += 1
        if buffers is None:
            metrics.BUFFER_LEASES.labels(self.model, "adhoc").inc()
            try:
                buffers = BufferSet(key, self._allocate(key), adhoc=True)
            except BaseException:
                with self._lock:
                    self.adhoc_live -= 1
                raise
        else:
            metrics.BUFFER_LEASES.labels(self.model, "pooled").inc()
        self._publish()
        try:
            yield buffers
        finally:
            with self._lock:
                if buffers.adhoc:
                    self.adhoc_live -= 1
                else:
                    self._free[key].append(buffers)
            self._publish()

    def _publish(self) -> None:
        metrics.BUFFER_FREE_SETS.labels(self.model).set(self.free_sets)
        metrics.BUFFER_ADHOC_LIVE.labels(self.model).set(self.adhoc_live)
