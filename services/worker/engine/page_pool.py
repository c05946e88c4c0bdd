"""Which KV-cache pages are free: the host's ledger of the text cache's pool (text_cache.py).

Page 0 is never handed out: block tables point their unused entries at it, and prefill pads
write into it, so every read of an unused entry is of finite values under a mask. A row asks
for its own home pages by number (`take`) and for any other page when those are taken
(`take_any`): the highest free one, far from the home pages of the rows that run most.

Pages are counted by the rows holding them, so that rows whose prompts begin alike share the
pages of that beginning (prefix caching, prefix_index.py). A full page of a prompt is known by
its content (`register`); when the last row holding it lets go it stays in the pool as it was,
evictable, least recently used first, until a row shares it again or the pool needs the page:
cached pages count as free for admission, so caching never holds a row back.
"""

import heapq
from collections import OrderedDict

from services.worker import metrics


class PagePool:
    def __init__(self, pages: int, model: str) -> None:
        """`pages` includes the reserved page 0."""
        self.total = pages - 1
        self._model = model
        self._free: set[int] = set()
        self._highest: list[int] = []  # a heap of -page; stale entries skipped
        self._refs: dict[int, int] = {}  # page -> rows holding it
        self._digest_of: dict[int, bytes] = {}  # cached pages' contents, by page
        self._page_of: dict[bytes, int] = {}  # and by content
        self._evictable: OrderedDict[int, None] = OrderedDict()  # unheld cached pages, LRU first
        self.clear()
        metrics.KV_PAGES_TOTAL.labels(model).set(self.total)
        metrics.KV_PAGES_USED.labels(model).set(0)  # the decoder sets it after each iteration

    def clear(self) -> None:
        """Every page free and nothing cached: what a pool is after a failed iteration, whose
        writes may have left any page half made."""
        pages = self.total + 1
        self._free = set(range(1, pages))
        self._highest = [-p for p in range(pages - 1, 0, -1)]
        self._refs.clear()
        self._digest_of.clear()
        self._page_of.clear()
        self._evictable.clear()

    @property
    def free(self) -> int:
        """Pages a row may take: free ones and cached ones no row holds."""
        return len(self._free) + len(self._evictable)

    @property
    def used(self) -> int:
        """Pages rows hold."""
        return self.total - self.free

    @property
    def cached(self) -> int:
        """Pages known by their content, held or not."""
        return len(self._page_of)

    def take(self, page: int) -> bool:
        """Page `page`, if no row holds it (a cached page no row holds is forgotten)."""
        if page in self._free:
            self._free.remove(page)
        elif page in self._evictable:
            del self._evictable[page]
            self._forget(page)
        else:
            return False
        self._refs[page] = 1
        return True

    def take_any(self) -> int:
        """A page no row holds: a free one, else the least recently used cached one; the
        caller made sure there is one."""
        while self._free:
            page = -heapq.heappop(self._highest)
            if page in self._free:
                self._free.remove(page)
                self._refs[page] = 1
                return page
        page, _ = self._evictable.popitem(last=False)
        self._forget(page)
        self._refs[page] = 1
        return page

    def give(self, pages: list[int]) -> None:
        """A row lets go of `pages`: each goes back to the pool once no row holds it, a cached
        one as the most recently used."""
        for page in pages:
            left = self._refs.pop(page) - 1
            if left:
                self._refs[page] = left
            elif page in self._digest_of:
                self._evictable[page] = None
            else:
                self._free.add(page)
                heapq.heappush(self._highest, -page)
        if len(self._highest) > 2 * self.total:  # drop the stale entries
            self._highest = [-p for p in self._free]
            heapq.heapify(self._highest)

    # Content ------------------------------------------------------------------------------

    def register(self, page: int, digest: bytes) -> None:
        """Full page `page`, held by a row, holds the content `digest` names. The first page
        known for a content keeps it: two rows that computed the same page keep their own."""
        if digest not in self._page_of and page not in self._digest_of:
            self._page_of[digest] = page
            self._digest_of[page] = digest

    def lookup(self, digest: bytes) -> int | None:
        return self._page_of.get(digest)

    def share(self, page: int) -> bool:
        """Hold cached page `page` for one more row; whether it was evictable (then it no
        longer counts as free)."""
        if page in self._evictable:
            del self._evictable[page]
            self._refs[page] = 1
            return True
        self._refs[page] += 1
        return False

    def movable(self, page: int) -> bool:
        """Whether a row may move `page`'s contents elsewhere: only a page no other row holds."""
        return self._refs.get(page) == 1

    def moved(self, src: int, dst: int) -> None:
        """Page `src`'s contents now lie in page `dst` (held by the same row): what `src` was
        known by, `dst` is; then the row lets go of `src`."""
        digest = self._digest_of.pop(src, None)
        if digest is not None:
            self._digest_of[dst] = digest
            self._page_of[digest] = dst
        self.give([src])

    def _forget(self, page: int) -> None:
        """A cached page no row holds is taken for other contents."""
        del self._page_of[self._digest_of.pop(page)]
        metrics.KV_PREFIX_EVICTIONS.labels(self._model).inc()
