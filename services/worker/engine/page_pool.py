"""Which KV-cache pages are free: the host's ledger of the text cache's pool (text_cache.py).

Page 0 is never handed out: block tables point their unused entries at it, and prefill pads
write into it, so every read of an unused entry is of finite values under a mask. A row asks
for its own home pages by number (`take`) and for any other page when those are taken
(`take_any`): the highest free one, far from the home pages of the rows that run most.
"""

import heapq

from services.worker import metrics


class PagePool:
    def __init__(self, pages: int, model: str) -> None:
        """`pages` includes the reserved page 0."""
        self.total = pages - 1
        self._free = set(range(1, pages))
        self._highest = [-p for p in range(pages - 1, 0, -1)]  # a heap; stale entries skipped
        metrics.KV_PAGES_TOTAL.labels(model).set(self.total)
        metrics.KV_PAGES_USED.labels(model).set(0)  # the decoder sets it after each iteration

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.total - len(self._free)

    def take(self, page: int) -> bool:
        """Page `page`, if it is free."""
        if page not in self._free:
            return False
        self._free.remove(page)
        return True

    def take_any(self) -> int:
        """A free page; the caller made sure there is one."""
        while True:
            page = -heapq.heappop(self._highest)
            if page in self._free:
                self._free.remove(page)
                return page

    def give(self, pages: list[int]) -> None:
        for page in pages:
            self._free.add(page)
            heapq.heappush(self._highest, -page)
        if len(self._highest) > 2 * self.total:  # drop the stale entries
            self._highest = [-p for p in self._free]
            heapq.heapify(self._highest)
