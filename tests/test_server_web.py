"""The web chat page in a real headless browser (Debian's chromium driven by Playwright).

Skips when chromium or playwright is missing (`apt-get install chromium`), unless
TALLOW_REQUIRE_BROWSER=1: then a missing browser fails the test.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

from server_utils import LiveServer, require_model

MODEL = "smollm2-135m"
CHROMIUM = os.environ.get("TALLOW_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


def _require_browser():
    missing = None
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing = "the playwright Python package is not installed"
    if missing is None and not os.path.exists(CHROMIUM):
        missing = "chromium is not installed (apt-get install chromium)"
    if missing:
        if os.environ.get("TALLOW_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{missing}, and TALLOW_REQUIRE_BROWSER=1 requires the browser test")
        pytest.skip(missing)


@pytest.fixture(scope="module")
def page_on_server():
    _require_browser()
    path = require_model(MODEL)
    import tallow
    from playwright.sync_api import sync_playwright

    server = LiveServer(lambda: tallow.LLM(path, ctx=1024), MODEL, str(path))
    try:
        server.wait_ready()
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            try:
                page = browser.new_page()
                page.goto(server.url + "/")
                yield server, page
            finally:
                browser.close()
    finally:
        server.stop()


@pytest.mark.slow
def test_page_streams_an_answer_with_tok_s(page_on_server):
    server, page = page_on_server
    page.wait_for_function("document.getElementById('model').textContent === 'smollm2-135m'")
    page.fill("#max_tokens", "12")
    page.fill("#temperature", "0")
    page.fill("#input", "Write a haiku about autumn.")
    page.click("#send")
    page.wait_for_selector(".msg.user")
    page.wait_for_function("document.querySelector('.msg.assistant .content').textContent.length > 0", timeout=60_000)
    page.wait_for_selector(".msg.assistant .meta.tps", timeout=60_000)
    meta = page.text_content(".msg.assistant .meta")
    assert "tok/s" in meta
    assert page.is_visible("#send") and not page.is_visible("#stop")


@pytest.mark.slow
def test_page_stop_button_stops_the_generation(page_on_server):
    server, page = page_on_server
    page.fill("#max_tokens", "400")
    page.fill("#input", "Write a very long story about a dragon.")
    page.click("#send")
    page.wait_for_function("document.querySelectorAll('.msg.assistant .content')[1]?.textContent.length > 5", timeout=60_000)
    page.click("#stop")
    page.wait_for_function("document.querySelectorAll('.msg.assistant .meta')[1]?.textContent.includes('stopped')", timeout=30_000)
    deadline = time.time() + 20
    while server.worker.running is not None:
        assert time.time() < deadline, "the server kept generating after Stop"
        time.sleep(0.05)
    assert len(server.worker.llm.last_tokens) < 200
