"""The page ledger: pages counted by the rows holding them, cached pages kept for reuse least
recently used first, and never holding a row back."""

from services.worker import metrics
from services.worker.engine.page_pool import PagePool


def _pool(pages: int = 4) -> PagePool:
    return PagePool(pages + 1, "pool-test")


def test_a_page_goes_back_when_the_last_row_holding_it_lets_go() -> None:
    pool = _pool()
    page = pool.take_any()
    pool.register(page, b"a")
    assert pool.share(page) is False  # held already
    pool.give([page])
    assert pool.used == 1 and pool.lookup(b"a") == page
    pool.give([page])
    # Kept for reuse, yet free to take.
    assert pool.used == 0 and pool.free == 4 and pool.lookup(b"a") == page


def test_sharing_an_unheld_cached_page_takes_it_out_of_the_free_count() -> None:
    pool = _pool()
    page = pool.take_any()
    pool.register(page, b"a")
    pool.give([page])
    assert pool.share(page) is True
    assert pool.free == 3 and pool.used == 1


def test_cached_pages_are_taken_last_and_least_recently_used_first() -> None:
    pool = _pool(3)
    pages = [pool.take_any() for _ in range(3)]
    for page, digest in zip(pages, (b"a", b"b", b"c"), strict=True):
        pool.register(page, digest)
    pool.give([pages[1]])
    pool.give([pages[0]])
    pool.give([pages[2]])
    before = metrics.KV_PREFIX_EVICTIONS.labels("pool-test")._value.get()
    # b went back first: it goes first, then a; c stays cached.
    assert pool.take_any() == pages[1]
    assert pool.take_any() == pages[0]
    assert pool.lookup(b"b") is None and pool.lookup(b"a") is None
    assert pool.lookup(b"c") == pages[2]
    assert metrics.KV_PREFIX_EVICTIONS.labels("pool-test")._value.get() == before + 2


def test_a_free_page_is_taken_before_a_cached_one() -> None:
    pool = _pool(2)
    cached = pool.take_any()
    pool.register(cached, b"a")
    pool.give([cached])
    assert pool.take_any() != cached
    assert pool.lookup(b"a") == cached


def test_taking_a_cached_page_by_number_forgets_its_content() -> None:
    pool = _pool()
    page = pool.take_any()
    pool.register(page, b"a")
    pool.give([page])
    assert pool.take(page) is True
    assert pool.lookup(b"a") is None and pool.used == 1
    assert pool.take(page) is False  # held


def test_the_first_page_known_for_a_content_keeps_it() -> None:
    pool = _pool()
    first, second = pool.take_any(), pool.take_any()
    pool.register(first, b"a")
    pool.register(second, b"a")
    assert pool.lookup(b"a") == first
    pool.give([second])
    assert pool.free == 3  # the unknown page went straight back


def test_only_a_page_no_other_row_holds_may_move() -> None:
    pool = _pool()
    own, known = pool.take_any(), pool.take_any()
    pool.register(known, b"a")
    assert pool.movable(own) and pool.movable(known)
    pool.share(known)
    assert not pool.movable(known)


def test_a_moved_page_is_known_where_its_contents_went() -> None:
    pool = _pool()
    src = pool.take_any()
    pool.register(src, b"a")
    assert pool.take(1)
    pool.moved(src, 1)
    assert pool.lookup(b"a") == 1 and pool.used == 1
    pool.give([1])
    assert pool.lookup(b"a") == 1 and pool.free == 4


def test_clear_frees_every_page_and_forgets_every_content() -> None:
    pool = _pool()
    page = pool.take_any()
    pool.register(page, b"a")
    pool.clear()
    assert pool.free == 4 and pool.cached == 0 and pool.lookup(b"a") is None
