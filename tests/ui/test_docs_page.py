"""/docs in a browser that can reach nothing but the API: Swagger UI renders every operation
from assets the API serves itself."""

from urllib.parse import urlsplit


def test_docs_render_with_no_network_beyond_the_api(browser, ui_stack):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    api_host = urlsplit(ui_stack.base_url).netloc
    elsewhere = []

    def only_the_api(route):
        if urlsplit(route.request.url).netloc == api_host:
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    context.route("**/*", only_the_api)
    page = context.new_page()
    try:
        page.goto(f"{ui_stack.base_url}/docs")
        page.wait_for_selector(".opblock-summary-path", timeout=30_000)
        paths = {el.inner_text().strip().replace("\u200b", "")
                 for el in page.query_selector_all(".opblock-summary-path")}
        assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/models"} <= paths, paths
        assert elsewhere == []
    finally:
        context.close()
