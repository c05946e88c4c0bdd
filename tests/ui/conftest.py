"""A live stack with API keys on, and a headless Chromium (Debian's, driven by Playwright)."""

import os
import shutil
from pathlib import Path

import pytest
import redis

from shared.settings import REPO_ROOT
from tests.e2e.conftest import launch_stack

API_KEY = "ui-test-key"
CHROMIUM = os.environ.get("FIBERMILL_TEST_CHROMIUM", "/usr/bin/chromium")  # Debian's
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
ARTIFACTS = REPO_ROOT / "artifacts" / "ui"
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}


# One stack for the package's modules, stopped when they are done: starting it costs more
# than a module's tests, and each test has its own browser context (own localStorage).
@pytest.fixture(scope="package")
def ui_stack(redis_server, model_dir, tmp_path_factory):
    """One API and one worker process: the page needs no more, and the machine has 2 cores.
    Keys are on, so every request of the page must carry one."""
    logs = tmp_path_factory.mktemp("ui-stack-logs")
    with redis.Redis.from_url(redis_server.url) as r:
        r.flushdb()
    env = {
        "FIBERMILL_REDIS_URL": redis_server.url,
        "FIBERMILL_MODEL_REGISTRY": str(model_dir / "registry.yaml"),
        "FIBERMILL_API_KEYS": API_KEY,
        "FIBERMILL_CPU_WORKERS": "1",
        "FIBERMILL_WORKER_CONCURRENCY": "2",
        "FIBERMILL_WORKER_MODELS": "digits,tiny-gpt2",
        "FIBERMILL_WORKER_METRICS_PORT": "0",
        "FIBERMILL_LOG_LEVEL": "WARNING",
    }
    with launch_stack(env, logs) as s:
        s.http.headers["Authorization"] = f"Bearer {API_KEY}"
        yield s


@pytest.fixture(scope="package")
def browser():
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} missing: apt-get install -y chromium"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def new_page(browser, ui_stack):
    """Make a page in a fresh browser context (own localStorage, as another person's browser
    would be); console errors are collected so a test can tell the page's own failures from
    the API's expected refusals."""
    contexts = []

    def make(viewport: dict = DESKTOP):
        context = browser.new_context(viewport=viewport, base_url=ui_stack.base_url)
        contexts.append(context)
        p = context.new_page()
        p.set_default_timeout(60_000)
        p.page_errors = []
        p.on("pageerror", lambda e: p.page_errors.append(str(e)))
        return p

    yield make
    for context in contexts:
        context.close()


@pytest.fixture
def page(new_page):
    return new_page()


@pytest.fixture
def phone(new_page):
    """The page at a phone's size (390x844 CSS pixels)."""
    return new_page(PHONE)


@pytest.fixture
def screenshot(tmp_path):
    """Save a screenshot under the test's tmp dir, and a copy in artifacts/ui/ for people."""

    def take(page, name: str) -> Path:
        path = tmp_path / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, ARTIFACTS / path.name)
        return path

    return take
