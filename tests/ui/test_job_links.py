"""Each job has an address, /#/jobs/{id}: set when it is submitted or opened, kept by a
reload, and shown to whoever opens it; and a finished job's bars read as finished."""

import json
import time

import pytest

from shared.job_ids import new_job_id
from tests.ui.helpers import IMAGES_LOADED, NEW_JOB_SHOWN, choose, job_posts, open_page

pytestmark = pytest.mark.e2e

# How full a bar is, in whole percent of its track.
FILLED = """sel => {
  const fill = document.querySelector(sel);
  return Math.round(100 * fill.getBoundingClientRect().width
    / fill.parentElement.getBoundingClientRect().width);
}"""


def test_a_submitted_job_keeps_its_address_through_a_reload_and_a_shared_link(page, new_page):
    open_page(page)
    posts = job_posts(page)
    choose(page, "digits", ["4"])
    page.fill("#steps", "1000")  # long enough to be still running after the reload
    page.click("#submit")
    page.wait_for_selector("#job-status.running")
    job_id = page.text_content("#job-id")
    assert page.url.endswith(f"/#/jobs/{job_id}")
    assert page.get_attribute("#job-link", "href") == f"#/jobs/{job_id}"
    assert posts[0]["task"] == "image-generation" and posts[0]["model"] == "digits"

    page.reload()
    page.wait_for_selector("#job-status.running")
    assert page.text_content("#job-id") == job_id
    # Step events arrive only on the live stream: the reloaded page follows the job.
    page.wait_for_selector("#step-meter:not([hidden])")

    # Another browser, with the same key and no history, opens the job from the link alone.
    other = new_page()
    open_page(other, path=f"/#/jobs/{job_id}")
    other.wait_for_selector("#job-card:not([hidden])")
    assert other.text_content("#job-id") == job_id
    other.wait_for_selector("#job-status.running")
    assert other.locator("#recent tbody tr").count() == 0

    page.click("#job-cancel")
    other.wait_for_selector("#job-status.canceled")  # the shared view follows it too
    assert page.page_errors == [] and other.page_errors == []


def test_recent_jobs_link_to_their_jobs_and_back_goes_to_the_previous_one(page):
    open_page(page)
    ids = []
    for digit in ("3", "8"):
        choose(page, "digits", [digit])
        page.click("#submit")
        page.wait_for_function(NEW_JOB_SHOWN, arg=ids)
        page.wait_for_selector("#job-status.succeeded")
        ids.append(page.text_content("#job-id"))
    assert len(set(ids)) == 2
    first = page.locator(f"#recent tr[data-id='{ids[0]}'] a[data-action=open]")
    assert first.get_attribute("href") == f"#/jobs/{ids[0]}"

    first.click()
    page.wait_for_function("id => document.querySelector('#job-id').textContent === id",
                           arg=ids[0])
    assert page.url.endswith(f"/#/jobs/{ids[0]}")
    page.wait_for_function(IMAGES_LOADED, arg=1)
    page.go_back()
    page.wait_for_function("id => document.querySelector('#job-id').textContent === id",
                           arg=ids[1])
    assert page.url.endswith(f"/#/jobs/{ids[1]}")
    assert page.page_errors == []


def test_a_succeeded_jobs_bars_are_full_and_marked_done(page):
    open_page(page)
    choose(page, "digits", ["3", "6"])
    page.click("#submit")
    page.wait_for_selector("#step-meter:not([hidden])")
    page.wait_for_selector("#job-status.succeeded")
    page.wait_for_function(IMAGES_LOADED, arg=2)

    assert page.text_content("#done-text") == "2 of 2 done"
    assert page.evaluate(FILLED, "#done-fill") == 100
    assert page.get_attribute("#done-meter", "data-state") == "done"
    # Workers report steps only between steps, so the last one seen was short of the end.
    assert page.is_visible("#step-meter")
    assert page.text_content("#step-text") == "done"
    assert page.evaluate(FILLED, "#step-fill") == 100
    assert page.get_attribute("#step-meter", "data-state") == "done"

    # Opened again from its address, with no live steps to show, it still reads as done.
    page.reload()
    page.wait_for_function(IMAGES_LOADED, arg=2)
    assert page.evaluate(FILLED, "#done-fill") == 100
    assert page.get_attribute("#done-meter", "data-state") == "done"
    assert page.page_errors == []


def test_a_recent_job_whose_record_expired_reads_as_expired(page):
    """Its record is gone after the record TTL: the API answers 410, and the page stops
    offering to follow or cancel it."""
    old = new_job_id(time.time() - 2 * 86400)
    page.goto("/")
    page.evaluate("""id => localStorage.setItem("fibermill.recent", JSON.stringify(
        [{id, model: "digits", status: "running"}]))""", old)
    open_page(page)
    row = page.locator(f"#recent tr[data-id='{old}']")
    row.locator(".badge.expired").wait_for()
    assert row.locator("button[data-action=cancel]").count() == 0

    open_page(page, path=f"/#/jobs/{old}")  # its link says why
    page.wait_for_selector(f"text=job {old} has expired")
    assert page.page_errors == []


def test_an_unknown_job_after_a_finished_one_shows_nothing_of_the_finished_one(page):
    open_page(page)
    choose(page, "digits", ["3"])
    page.click("#submit")
    page.wait_for_selector("#job-status.succeeded")
    assert page.evaluate(FILLED, "#done-fill") == 100

    unknown = new_job_id()
    page.evaluate("id => { window.location.hash = `#/jobs/${id}`; }", unknown)
    page.wait_for_selector("#job-error:text('Not found')")
    assert page.text_content("#job-id") == unknown
    # Its badge, line and bars were the finished job's: none stays beside "Not found".
    assert page.is_hidden("#job-status") and page.text_content("#job-status") == ""
    assert page.is_hidden("#done-meter") and page.is_hidden("#step-meter")
    assert page.text_content("#job-meta") == "" and page.is_hidden("#job-cancel")
    assert page.locator("#results > *").count() == 0
    assert page.page_errors == []


def sse(*events: tuple[str, dict]) -> str:
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events)


def test_outputs_stepping_as_one_batch_read_as_one_batch(page):
    """Each output of a batch reports its own steps: twelve outputs at step 63 are one batch
    at step 63, not output #12 at step 63 beside "0 of 12 done"."""
    job_id = new_job_id()
    job = {"id": job_id, "status": "running", "task": "image-generation", "model": "digits",
           "progress": {"done": 0, "total": 12}}

    def steps(indices, step):
        return [("step", {"index": i, "step": step + i % 2, "steps": 200}) for i in indices]

    def done(n):
        return ("progress", {"done": n, "total": 12})

    streams = [
        steps(range(12), 63),
        # Two batches of six, one after the other, at the same steps: the first is done.
        [*steps(range(6), 190), done(6), *steps(range(6, 12), 190)],
        # One output left, running alone.
        [*steps(range(12), 190), done(11), ("step", {"index": 11, "step": 5, "steps": 200})],
    ]
    phase = [0]  # which stream this load of the page is served
    records = [0, 6, 11]  # the done count of the record, as each stream leaves it

    def events(route):
        body = sse(("status", job), *streams[phase[0]])
        route.fulfill(status=200, content_type="text/event-stream", body=body)

    def record(route):
        # Read after the stream ends, it agrees with what the stream said.
        route.fulfill(json={**job, "progress": {"done": records[phase[0]], "total": 12}})

    page.route(f"**/v1/jobs/{job_id}/events", events)
    page.route(f"**/v1/jobs/{job_id}", record)
    open_page(page, path=f"/#/jobs/{job_id}")
    page.wait_for_selector("#step-text:text-is('64 of 200')")  # output #12's, the last
    assert page.text_content("#step-label") == "12 outputs in one batch: denoise step"
    assert page.text_content("#done-text") == "0 of 12 done"

    phase[0] = 1
    page.reload()
    page.wait_for_selector("#done-text:text('6 of 12 done')")
    assert page.text_content("#step-label") == "6 outputs in one batch: denoise step"

    phase[0] = 2
    page.reload()
    page.wait_for_selector("#done-text:text('11 of 12 done')")
    assert page.text_content("#step-label") == "Output #12: denoise step"
    assert page.text_content("#step-text") == "5 of 200"
    assert page.page_errors == []
