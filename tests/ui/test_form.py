"""The form: it shows each field's range and leaves judging to the server, shows every
refusal at once, starts each model with a prompt of its own, and reads each model's parameters
from /v1/models."""

import pytest

from tests.ui.helpers import choose, job_posts, open_page

pytestmark = pytest.mark.e2e

DASH = "\N{EN DASH}"  # between the ends of a range shown beside a field

IMAGE_PARAMETERS = ("steps", "width", "height", "guidance_scale", "num_images_per_prompt",
                    "negative_prompt", "seed")
TEXT_PARAMETERS = ("max_new_tokens", "temperature", "top_p", "top_k", "stop", "seed")


def refused(page, fills: dict[str, str]) -> None:
    """Fill the fields, press Submit, and wait for the refusal."""
    for field, value in fills.items():
        page.fill(f"#{field}", value)
    page.click("#submit")
    page.wait_for_selector("#form-error:not(:empty)")


def error(page, field: str) -> str:
    return page.text_content(f"[data-error-for='{field}']")


def reshape_models(page, change) -> dict:
    """Serve /v1/models as `change(model)` leaves each entry; returns the models as served."""
    served = {}

    def handle(route):
        response = route.fetch()
        body = response.json()
        for model in body.get("models", []):  # none before the key is given
            change(model)
            served[model["name"]] = model
        route.fulfill(response=response, json=body)

    page.route("**/v1/models", handle)
    return served


def test_every_problem_shows_at_once_the_shown_ranges_stopping_nothing(page):
    # A range beside a field is a guide: checked by the page first, it would hide the
    # server's other problems (a prompt the model cannot draw) until it was fixed.
    open_page(page)
    posts = job_posts(page)
    choose(page, "digits", ["dog", "3"])
    assert page.text_content("#width + .hint") == "must be 16"
    wrong = {"steps": ("1001", "1000"), "width": ("24", "must be 16"),
             "height": ("8", "must be 16"), "num_images_per_prompt": ("9", "8"),
             "guidance_scale": ("51", "50"), "seed": ("-1", "at least 0"),
             "priority": ("10", "9")}
    refused(page, {field: value for field, (value, _) in wrong.items()})
    for field, (_, words) in wrong.items():
        name = field if field == "priority" else f"input.{field}"
        assert words in error(page, name), (field, error(page, name))
        assert page.get_attribute(f"#{field}", "aria-invalid") == "true", field
    assert "names no class" in error(page, "input.prompts.0")  # beside the ranges' problems
    assert error(page, "input.prompts.1") == ""
    assert "fix" in page.text_content("#form-error")
    assert len(posts) == 1 and posts[0]["input"]["width"] == 24
    assert posts[0]["priority"] == 10

    choose(page, "tiny-gpt2", ["Hello"])
    refused(page, {"max_new_tokens": "257", "temperature": "6"})
    assert "256" in error(page, "input.max_new_tokens")
    assert "5" in error(page, "input.temperature")
    # The image fields are hidden now: whatever they still hold is neither checked nor sent.
    assert "width" not in posts[1]["input"] and "width" not in page.text_content("#form-error")
    assert page.is_hidden("#job-card")
    assert page.page_errors == []


def test_every_problem_in_a_refusal_shows_beside_its_field(page):
    detail = [
        {"loc": ["body", "input", "width"], "msg": "must be 16 for model digits", "type": "x"},
        {"loc": ["body", "input", "height"], "msg": "must be 16 for model digits", "type": "x"},
        {"loc": ["body", "input", "prompts", 1], "msg": "must not be empty", "type": "x"},
        {"loc": ["body", "input", "prompts", 5], "msg": "is past the end", "type": "x"},
        {"loc": ["body", "input", "prompts"], "msg": "takes at most 64 entries", "type": "x"},
        {"loc": ["body", "webhook"], "msg": "must be an http(s) URL", "type": "x"},
    ]
    open_page(page)
    page.route("**/v1/jobs", lambda route: route.fulfill(status=422, json={"detail": detail}))
    choose(page, "digits", ["3", "4"])
    page.click("#submit")
    page.wait_for_selector("#form-error:not(:empty)")
    assert error(page, "input.width") == "must be 16 for model digits"
    assert error(page, "input.height") == "must be 16 for model digits"
    assert error(page, "input.prompts.1") == "must not be empty"
    # Two problems for the list as a whole share its slot; neither hides the other.
    assert error(page, "input.prompts") == "is past the end; takes at most 64 entries"
    assert "webhook: must be an http(s) URL" in page.text_content("#form-error")
    assert page.page_errors == []


def test_the_digits_example_prompt_gives_way_to_a_text_model(page):
    open_page(page)
    prompt = "#prompts li:nth-child(1) input"
    page.select_option("#model", "digits")
    assert page.input_value(prompt) == "3"
    page.select_option("#model", "tiny-gpt2")
    assert page.input_value(prompt) == ""
    assert page.get_attribute(prompt, "placeholder") == "Text to continue"  # it completes
    page.select_option("#model", "tiny-sd")
    assert page.get_attribute(prompt, "placeholder") == "Describe the image to draw"
    page.select_option("#model", "digits")
    assert page.input_value(prompt) == "3"

    page.fill(prompt, "a handwritten five")  # the person's own prompt stays theirs
    page.select_option("#model", "tiny-gpt2")
    assert page.input_value(prompt) == "a handwritten five"
    assert page.page_errors == []


def test_ranges_and_defaults_come_from_each_models_parameters(page):
    def change(model):
        names = IMAGE_PARAMETERS if model["task"] == "image-generation" else TEXT_PARAMETERS
        model["parameters"] = {n: {"type": "number"} for n in names if n != "negative_prompt"}
        if model["name"] == "digits":
            model["parameters"]["steps"] = {"type": "integer", "default": 12, "minimum": 2,
                                            "maximum": 77}
        if model["name"] == "tiny-gpt2":
            model["parameters"]["max_new_tokens"] = {"type": "integer", "default": 9,
                                                     "minimum": 1, "maximum": 33}

    reshape_models(page, change)
    open_page(page)
    choose(page, "digits", ["3"])
    assert page.get_attribute("#steps", "placeholder") == "12"
    assert page.text_content("#steps + .hint") == f"2{DASH}77"
    assert page.is_hidden("#negative_prompt")  # not among the model's parameters

    choose(page, "tiny-gpt2", ["Hello"])
    assert page.get_attribute("#max_new_tokens", "placeholder") == "9"
    assert page.text_content("#max_new_tokens + .hint") == f"1{DASH}33"
    assert page.get_attribute("#seed", "placeholder") == "random"  # no default: the page's
    assert page.page_errors == []
