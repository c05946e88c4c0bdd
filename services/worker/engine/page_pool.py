"""Which KV-cache pages are free: the host's ledger of the text cache's pool (text_cache.py).

Page 0 is never handed out: block tables point their unused entries at it, and prefill pads
write into it, so every read of an unused entry is of finite values under a mask.
"""

from services.worker import metrics


class PagePool:
    def __init__(self, pages: int, model: str) -> None:
        """`pages` includes the reserved page 0."""
        self.model = model
        self._free = list(range(pages - 1, 0, -1))  # popped from the end: low pages first
        self.total = pages - 1
        metrics.KV_PAGES_TOTAL.labels(model).set(self.total)
        metrics.KV_PAGES_USED.labels(model).set(0)

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.total - len(self._free)

    def take(self, n: int) -> list[int]:
        """`n` free pages; the caller made sure there are that many."""
        assert n <= len(self._free), "pages taken past the pool"
        pages = [self._free.pop() for _ in range(n)]
        metrics.KV_PAGES_USED.labels(self.model).set(self.used)
        return pages

    def give(self, pages: list[int]) -> None:
        self._free.extend(reversed(pages))
        metrics.KV_PAGES_USED.labels(self.model).set(self.used)
