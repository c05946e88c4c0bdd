"""Page digests name a page's tokens and every token before them."""

from services.worker.engine.prefix_pages import page_digests
from services.worker.engine.text_cache import PAGE_TOKENS


def test_only_full_pages_have_digests() -> None:
    assert page_digests(list(range(PAGE_TOKENS - 1))) == []
    assert len(page_digests(list(range(3 * PAGE_TOKENS + 5)))) == 3


def test_equal_beginnings_give_equal_digests_up_to_where_they_differ() -> None:
    a = list(range(3 * PAGE_TOKENS))
    b = [*a[:PAGE_TOKENS + 3], 999, *a[PAGE_TOKENS + 4:]]
    da, db = page_digests(a), page_digests(b)
    assert da[0] == db[0]
    # The second page differs, and so does every page after it, though the third's tokens
    # are the same.
    assert da[1] != db[1] and da[2] != db[2]


def test_a_page_of_the_same_tokens_at_another_place_differs() -> None:
    page = list(range(PAGE_TOKENS))
    assert page_digests(page + page)[1] != page_digests(page)[0]
