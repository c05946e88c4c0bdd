"""The page's files: served by the API, outside its schema, and nothing fetched from elsewhere."""

import re

from fastapi.testclient import TestClient

from services.api.app import create_app
from services.api.routes.ui import STATIC_DIR

# Any absolute URL in the page's own files would be a request that fails offline.
EXTERNAL = re.compile(r"""(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}""", re.IGNORECASE)


def test_page_and_assets_are_served_and_kept_out_of_the_schema():
    client = TestClient(create_app())  # no lifespan: these routes need neither Redis nor workers
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["cache-control"] == "no-cache"
    for src in re.findall(r'(?:src|href)="(/static/[^"]+)"', page.text):
        assert client.get(src).status_code == 200, src
    script = client.get("/static/app.js")
    assert script.headers["content-type"].startswith("text/javascript")
    paths = client.get("/openapi.json").json()["paths"]
    assert "/" not in paths and not any(p.startswith("/static") for p in paths)


def test_no_file_of_the_page_refers_to_another_host():
    files = [p for p in STATIC_DIR.rglob("*") if p.is_file()]
    assert {p.suffix for p in files} == {".html", ".js", ".css"}
    for path in files:
        found = EXTERNAL.findall(path.read_text())
        assert not found, f"{path.name} refers to {found}"


def test_every_module_the_page_imports_exists():
    for path in STATIC_DIR.rglob("*.js"):
        for target in re.findall(r'from "(\./[^"]+)"', path.read_text()):
            assert (path.parent / target).resolve().is_file(), f"{path.name}: {target}"
