"""Playwright with the system Chromium, shared by the browser tests (`pytest_plugins = ["browser"]`): a module's
browser, its pages' console errors, and new pages that record them. Modules mark themselves with `NEEDS_BROWSER`,
so they skip (with the reason) where Chromium or Playwright is missing."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

try:
    from playwright import sync_api
except ImportError:  # the modules that need it skip
    sync_api = None

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).parent / "artifacts"
TIMEOUT_MS = 30_000
NEEDS_BROWSER = [
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason=f"system Chromium not found at {CHROMIUM} (apt-get install chromium)"),
    pytest.mark.skipif(sync_api is None, reason="playwright is not installed (pip install playwright)")]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    assert sync_api is not None
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def errors() -> list[str]:
    """Console errors and uncaught exceptions of the module's pages."""
    return []


def new_page(browser: Any, errors: list[str] | None = None) -> Any:
    """A desktop-sized page with the tests' timeout; its console errors and exceptions go to `errors`."""
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(TIMEOUT_MS)
    if errors is not None:
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
    return page
