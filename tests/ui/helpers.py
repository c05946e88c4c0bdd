"""What the page tests do again and again: connect with the key, fill the form."""

from tests.ui.conftest import API_KEY

# After a submit: the new job's card, not the last one's (it still reads succeeded until the
# POST is in); `known` is the ids shown before.
NEW_JOB_SHOWN = """known => { const id = document.querySelector('#job-id');
  return id && id.textContent && !known.includes(id.textContent) }"""

IMAGES_LOADED = """n => {
  const imgs = [...document.querySelectorAll('#results img')];
  return imgs.length === n && imgs.every(i => i.complete && i.naturalWidth > 0);
}"""


def open_page(page, key: str = API_KEY, path: str = "/"):
    page.goto(path)
    page.fill("#api-key", key)
    page.click("#key-form button[type=submit]")
    page.wait_for_selector("body[data-connected]")
    assert page.text_content("#key-state") == "key saved"
    assert page.is_hidden("#banner")


def choose(page, model: str, prompts: list[str]) -> None:
    page.select_option("#model", model)
    for i, prompt in enumerate(prompts):
        if i >= page.locator("#prompts li").count():
            page.click("#add-prompt")
        page.fill(f"#prompts li:nth-child({i + 1}) input", prompt)


def job_posts(page) -> list[dict]:
    """The bodies of the jobs the page submits from now on."""
    bodies: list[dict] = []
    page.on("request", lambda r: bodies.append(r.post_data_json)
            if r.method == "POST" and r.url.endswith("/v1/jobs") else None)
    return bodies
