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
def browser():
    """One chromium for the module: Playwright's sync API cannot be started twice at once."""
    _require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def page_on_server(browser):
    path = require_model(MODEL)
    import tallow

    server = LiveServer(lambda: tallow.LLM(path, ctx=1024), MODEL, str(path))
    try:
        server.wait_ready()
        page = browser.new_page()
        page.goto(server.url + "/")
        yield server, page
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


@pytest.mark.slow
def test_page_points_to_the_key_field_and_hides_thinking_for_models_that_do_not_think(tmp_path, browser):
    """A server with a key: the page names its key field (not an HTTP header); once the key
    is entered, "allow thinking" is hidden for a template without a thinking switch."""
    import tallow
    from tiny_models import write_tiny_model

    path = write_tiny_model("llama", tmp_path / "tiny.gguf")
    server = LiveServer(lambda: tallow.LLM(path, ctx=256, device="cpu"), "tiny", str(path), api_key="sesame")
    try:
        server.wait_ready()
        page = browser.new_page()
        try:
            page.goto(server.url + "/")
            page.wait_for_function("document.getElementById('model').textContent.includes('API key')")
            assert "enter it in the \"API key\" field" in page.text_content("#model")
            assert "Authorization" not in page.text_content("#model")
            page.fill("#apikey", "sesame")
            page.dispatch_event("#apikey", "change")
            page.wait_for_function("document.getElementById('model').textContent === 'tiny'")
            page.wait_for_function("document.getElementById('thinking-row').hidden")
            assert not page.is_visible("#thinking")
        finally:
            page.close()
    finally:
        server.stop()


def test_page_key_hint_logic_in_node():
    """The page's keyHint() run by node (no browser needed): a 401's header advice becomes a
    pointer to the key field; other messages pass unchanged."""
    import json
    import re
    import subprocess
    from pathlib import Path

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    page = (Path(__file__).parent.parent / "tallow" / "server" / "static" / "index.html").read_text(encoding="utf-8")
    fn = re.search(r"function keyHint\(message\) \{.*?\n\}", page, re.S).group(0)
    from tallow.server.app import create_app  # noqa: F401  (the page is served by this app)

    msg_401 = "The API key is missing or wrong: send it as 'Authorization: Bearer KEY'."
    script = fn + f"\nconsole.log(JSON.stringify([keyHint({json.dumps(msg_401)}), keyHint('model not loaded')]));"
    out = json.loads(subprocess.run([node, "-e", script], capture_output=True, text=True, timeout=30, check=True).stdout)
    assert out == ['this server needs an API key: enter it in the "API key" field on the left.', "model not loaded"]
    assert msg_401 in (Path(__file__).parent.parent / "tallow" / "server" / "app.py").read_text(encoding="utf-8")
