"""The web page against a live API and worker, in headless Chromium."""

import re

import pytest

from tests.ui.conftest import API_KEY
from tests.ui.helpers import IMAGES_LOADED, choose, open_page

pytestmark = pytest.mark.e2e

# Every step event the page shows is recorded, to prove progress was followed live.
RECORD_STEPS = """
window.__steps = [];
document.addEventListener("DOMContentLoaded", () => {
  const text = document.querySelector("#step-text");
  new MutationObserver(() => window.__steps.push(text.textContent))
    .observe(text, {childList: true, characterData: true, subtree: true});
});
"""


def test_without_a_key_the_page_asks_for_one(page):
    page.goto("/")
    banner = page.locator("#banner")
    banner.wait_for()
    assert "needs a valid key" in banner.text_content()
    assert page.locator("#api-key").get_attribute("aria-invalid") is not None
    assert page.locator("body[data-connected]").count() == 0
    page.fill("#api-key", API_KEY)
    page.click("#key-form button[type=submit]")
    page.wait_for_selector("body[data-connected]")
    assert page.is_hidden("#banner")
    # The key is kept in the browser: a reload needs no typing.
    page.reload()
    page.wait_for_selector("body[data-connected]")
    assert page.input_value("#api-key") == API_KEY
    assert page.page_errors == []


def test_digits_job_shows_a_grid_of_four_images(page, ui_stack, screenshot):
    page.add_init_script(RECORD_STEPS)
    open_page(page)
    choose(page, "digits", ["7", "a handwritten three"])
    page.fill("#num_images_per_prompt", "2")
    page.fill("#seed", "1")
    page.click("#submit")
    page.wait_for_function(IMAGES_LOADED, arg=4)

    assert page.text_content("#job-status") == "succeeded"
    assert page.text_content("#done-text") == "4 of 4 done"
    steps = page.evaluate("window.__steps")
    assert any(re.fullmatch(r"\d+ of 50", s) for s in steps), steps
    images = page.evaluate("""[...document.querySelectorAll('#results img')].map(i => ({
        natural: [i.naturalWidth, i.naturalHeight], shown: [i.clientWidth, i.clientHeight],
        scale: Number(i.dataset.scale), pixelated: getComputedStyle(i).imageRendering}))""")
    for img in images:
        assert img["natural"] == [16, 16]
        assert img["shown"] == [16 * img["scale"], 16 * img["scale"]] and img["scale"] > 1
        assert img["pixelated"] == "pixelated"
    captions = page.locator("#results figcaption").all_text_contents()
    assert [re.search(r"seed (\d+)", c).group(1) for c in captions] == ["1", "2", "3", "4"]
    assert "“7”" in captions[0] and "“a handwritten three”" in captions[3]
    links = page.locator("#results a.download")
    assert links.count() == 4
    assert links.first.get_attribute("href").startswith("blob:")
    job_id = page.text_content("#job-id")
    assert links.first.get_attribute("download") == f"{job_id}-0-seed1.png"

    row = page.locator(f"#recent tr[data-id='{job_id}']")
    assert row.locator(".badge").text_content() == "succeeded"
    assert ui_stack.http.get(f"/v1/jobs/{job_id}").json()["status"] == "succeeded"
    shot = screenshot(page, "digits-grid")
    assert shot.stat().st_size > 10_000

    # The list outlives the page, and a past job opens with its images.
    page.goto("/")
    page.click(f"#recent tr[data-id='{job_id}'] a[data-action=open]")
    page.wait_for_function(IMAGES_LOADED, arg=4)
    assert page.text_content("#job-id") == job_id
    assert page.url.endswith(f"/#/jobs/{job_id}")
    assert page.page_errors == []


def test_without_the_event_stream_the_page_polls(page):
    open_page(page)
    page.route("**/events", lambda route: route.abort())
    choose(page, "digits", ["1"])
    page.click("#submit")
    page.wait_for_function(IMAGES_LOADED, arg=1)
    assert page.text_content("#job-status") == "succeeded"
    assert page.text_content("#job-error") == ""
    assert page.page_errors == []


def test_the_servers_refusals_are_shown_next_to_their_fields(page):
    # Which words name a digit is the server's to judge: the page sends these, and shows
    # every prompt the server refused beside that prompt.
    open_page(page)
    choose(page, "digits", ["dog", "3", "a cat"])
    page.click("#submit")
    page.wait_for_selector("[data-error-for='input.prompts.2']:not(:empty)")
    for i in (0, 2):
        assert "names no class" in page.text_content(f"[data-error-for='input.prompts.{i}']")
        assert page.get_attribute(f"#prompts li:nth-child({i + 1}) input",
                                  "aria-invalid") == "true"
    assert page.is_hidden("[data-error-for='input.prompts.1']")
    assert "fix" in page.text_content("#form-error")

    page.fill("#prompts li:nth-child(1) input", "4")
    assert page.is_hidden("[data-error-for='input.prompts.0']")  # editing clears the error
    assert page.is_visible("[data-error-for='input.prompts.2']")
    # A number field holding text is refused by name, not sent as nothing at all (the
    # model's default in its place), and with the other problems.
    page.locator("#seed").press_sequentially("1e")
    page.click("#submit")
    page.wait_for_selector("[data-error-for='input.seed']:not(:empty)")
    assert page.text_content("[data-error-for='input.seed']") == "must be a whole number"
    assert "names no class" in page.text_content("[data-error-for='input.prompts.2']")
    assert page.is_hidden("#job-card")
    assert page.locator("#recent tbody tr").count() == 0
    assert page.page_errors == []


def test_running_job_can_be_canceled(page, ui_stack):
    open_page(page)
    choose(page, "digits", ["4"])
    page.fill("#steps", "1000")
    page.click("#submit")
    page.wait_for_selector("#job-status.running")
    page.wait_for_selector("#step-meter:not([hidden])")
    job_id = page.text_content("#job-id")
    page.click("#job-cancel")
    page.wait_for_selector("#job-status.canceled")
    assert page.is_hidden("#job-cancel")
    assert page.text_content("#results .missing") == "canceled"
    row = page.locator(f"#recent tr[data-id='{job_id}']")
    row.locator(".badge.canceled").wait_for()
    assert row.locator("button[data-action=cancel]").count() == 0
    assert ui_stack.http.get(f"/v1/jobs/{job_id}").json()["status"] == "canceled"
    assert page.page_errors == []


def test_text_job_shows_texts_beside_their_prompts(page):
    open_page(page)
    choose(page, "tiny-gpt2", ["Hello", "The sun"])
    assert page.is_hidden("#width") and page.is_visible("#max_new_tokens")
    page.fill("#max_new_tokens", "5")
    page.click("#submit")
    page.wait_for_selector("#job-status.succeeded")
    cards = page.locator("#results article.text")
    cards.nth(1).wait_for()
    assert cards.locator(".prompt").all_text_contents() == ["Hello", "The sun"]
    assert cards.locator(".reason").all_text_contents() == ["length", "length"]
    assert cards.locator(".tokens").all_text_contents() == ["5 tokens", "5 tokens"]
    boxes = [cards.nth(i).bounding_box() for i in range(2)]
    assert boxes[0]["y"] == boxes[1]["y"] and boxes[0]["x"] < boxes[1]["x"]  # side by side
    # Its timeline (GET ?include=timeline): each output queued, leased, started and finished,
    # by a worker, in one attempt; no trace id, since this stack does not trace.
    page.wait_for_selector("#job-timeline:not([hidden])")
    page.click("#job-timeline summary")
    rows = page.locator("#timeline tbody tr")
    assert rows.count() == 2
    for i in range(2):
        cells = rows.nth(i).locator("td").all_text_contents()
        assert cells[0] == f"#{i + 1}" and all(c.startswith("+") for c in cells[1:5]), cells
        assert cells[5] == "1" and cells[6] not in ("", "\u2013"), cells
    assert page.is_hidden("#job-trace")
    assert page.page_errors == []


@pytest.mark.parametrize(
    ("status", "detail", "expected"),
    [
        (429, "rate limit exceeded", "Too many jobs submitted in a short time. "
                                     "Try again in 7 seconds."),
        (503, "queue of model digits is full", "The service is busy right now (queue of model "
                                               "digits is full). Try again in 7 seconds."),
    ],
    ids=["429", "503"],
)
def test_busy_answers_read_as_plain_messages(page, status, detail, expected):
    open_page(page)
    page.route("**/v1/jobs", lambda route: route.fulfill(
        status=status, headers={"Retry-After": "7"}, json={"detail": detail, "code": "x"}))
    choose(page, "digits", ["7"])
    page.click("#submit")
    page.wait_for_selector("#form-error:not(:empty)")
    assert page.text_content("#form-error") == expected
    assert page.is_enabled("#submit")
