"""The page on a phone (390x844): nothing wider than the screen, the form first, and the job
brought into view when it is submitted."""

import pytest

from tests.ui.conftest import PHONE
from tests.ui.helpers import IMAGES_LOADED, NEW_JOB_SHOWN, choose, open_page

pytestmark = pytest.mark.e2e

PAGE_WIDTH = "document.documentElement.scrollWidth"
# The recent jobs' table fits its card, rather than scrolling inside it.
TABLE_FITS = """() => {
  const wrap = document.querySelector('#recent').parentElement;
  return wrap.scrollWidth <= wrap.clientWidth; }"""
# The job's head and its outputs bar are on screen: the person sees that it runs.
JOB_IN_VIEW = """() => {
  const card = document.querySelector('#job-card').getBoundingClientRect();
  const bar = document.querySelector('#done-meter').getBoundingClientRect();
  return card.top >= 0 && bar.bottom <= window.innerHeight;
}"""


def top(page, selector: str) -> float:
    return page.locator(selector).bounding_box()["y"]


def test_phone_page_is_no_wider_than_the_screen_and_shows_the_form_first(phone, screenshot):
    phone.goto("/")
    phone.wait_for_selector("#banner:not([hidden])")  # no key yet: the key form is in use
    assert phone.evaluate(PAGE_WIDTH) <= PHONE["width"]

    open_page(phone)
    assert top(phone, "#submit-card") < top(phone, "#recent-card")

    ids: list[str] = []
    for digit in ("3", "5"):
        choose(phone, "digits", [digit])
        phone.click("#submit")
        phone.wait_for_function(NEW_JOB_SHOWN, arg=ids)
        ids.append(phone.text_content("#job-id"))
        phone.wait_for_function(JOB_IN_VIEW)
        assert phone.evaluate(PAGE_WIDTH) <= PHONE["width"]
        assert phone.evaluate(TABLE_FITS)  # a live row, with its Cancel button, fits too
        phone.wait_for_selector("#job-status.succeeded")
    phone.wait_for_function(IMAGES_LOADED, arg=1)

    assert phone.locator("#recent tbody tr").count() == 2
    assert phone.evaluate(PAGE_WIDTH) <= PHONE["width"]
    assert phone.evaluate(TABLE_FITS)
    assert top(phone, "#submit-card") < top(phone, "#job-card") < top(phone, "#recent-card")
    screenshot(phone, "phone-after")
    assert phone.page_errors == []
