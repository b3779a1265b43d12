"""Playwright with the system Chromium, shared by the browser tests (`pytest_plugins = ["support.browser"]`): a module's
browser, its pages' console errors, new pages that record them, and the UI steps several modules take (chat in a
mode, pick from a dropdown, a screenshot). Modules mark themselves `pytestmark = [pytest.mark.browser,
*NEEDS_BROWSER]`, so `-m "not browser"` leaves them out and they skip (with the reason) where Chromium or
Playwright is missing."""
from __future__ import annotations

import os
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
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
DOC_SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
"""Where `make screenshots` (SPECSCOPE_DOC_SHOTS=1) writes the README's screenshots; the suite itself never does."""
TIMEOUT_MS = 30_000
PROMPT = "Reverse: q w e r t y u i"   # eight answer tokens: ar makes a run of several rounds
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


TOAST_WATCH = """new MutationObserver((changes) => {
  for (const change of changes)
    for (const node of change.addedNodes)
      if (node.nodeType === 1)
        for (const toast of [node, ...node.querySelectorAll('.toast-body.error')])
          if (toast.matches('.toast-body.error') && !/Connection to the server was lost/.test(toast.innerText))
            console.error(`Gradio error toast: ${toast.innerText}`);
}).observe(document, {childList: true, subtree: true});"""
"""Reports every error toast Gradio shows (an event handler that raised) as a console error; not the one a page
shows as it navigates away (its event stream closes: "Connection to the server was lost")."""


@pytest.fixture(scope="module")
def errors() -> list[str]:
    """Console errors, uncaught exceptions and Gradio's error toasts of the module's pages."""
    return []


def new_page(browser: Any, errors: list[str] | None = None) -> Any:
    """A desktop-sized page with the tests' timeout; its console errors, exceptions and error toasts go to
    `errors`."""
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(TIMEOUT_MS)
    if errors is not None:
        page.add_init_script(TOAST_WATCH)
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
    return page


def shot(page: Any, name: str) -> None:
    page.wait_for_timeout(300)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def doc_shot(page: Any, name: str) -> None:
    """A README screenshot: into docs/screenshots/ under `make screenshots`, else into the artifacts, so that a
    test run leaves the work tree as it was."""
    folder = DOC_SHOTS if os.environ.get("SPECSCOPE_DOC_SHOTS") else ARTIFACTS
    page.screenshot(path=str(folder / f"{name}.png"))


def set_number(page: Any, selector: str, value: int) -> None:
    box = page.locator(f"{selector} input[type=number]")
    box.fill(str(value))
    box.press("Enter")
    page.wait_for_timeout(300)


def choose(page: Any, dropdown: str, option: str) -> None:
    page.click(f"{dropdown} input")
    page.get_by_role("option", name=option, exact=True).click()


def open_params(page: Any) -> None:
    """Open the chat's parameters, collapsed at first (once opened they stay open in every mode)."""
    if not page.locator("#param-max_new_tokens").is_visible():
        page.click("#chat-params > button.label-wrap")
        page.locator("#param-max_new_tokens").wait_for()


def chat(page: Any, mode: str) -> None:
    """Send PROMPT in `mode` (12 new tokens) and wait for its answer's stats."""
    choose(page, "#chat-mode", mode)
    page.wait_for_function("m => document.querySelector('#chat-mode input').value === m", arg=mode)
    page.wait_for_selector(f"text={mode}:")  # that mode's parameters have rendered
    open_params(page)
    set_number(page, "#param-max_new_tokens", 12)
    answers = page.locator("#chat-bot .bot").count()
    page.fill("#chat-input textarea", PROMPT)
    page.press("#chat-input textarea", "Enter")
    page.wait_for_function("n => document.querySelectorAll('#chat-bot .bot').length > n", arg=answers)
    wait_last_answer(page, f"{mode}\\s*· TPF")


def wait_last_answer(page: Any, pattern: str, timeout: float | None = None) -> None:
    """Wait until the chat's last answer matches the regular expression `pattern`. (A `.bot:last-of-type` selector
    matches every answer, each being the last of its own row, so it also finds an earlier answer's text.)"""
    page.wait_for_function("p => new RegExp(p).test([...document.querySelectorAll('#chat-bot .bot')].pop()?.innerText"
                           " ?? '')", arg=pattern, **({} if timeout is None else {"timeout": timeout}))


CODE_PROMPT = "import os\n\n\nclass Config:\n    def __init__(self, path):\n        "
"""A raw-completion prompt that keeps a tiny model going until max_new_tokens."""


def start_long_raw_run(page: Any, mode: str, max_new_tokens: int) -> None:
    """Send CODE_PROMPT raw in `mode` and return once its run has started (its id is in #chat-run)."""
    choose(page, "#chat-mode", mode)
    page.wait_for_selector(f"text={mode}:")
    open_params(page)
    set_number(page, "#param-max_new_tokens", max_new_tokens)
    page.check("#param-raw input[type=checkbox]")
    before = page.input_value("#chat-run textarea")
    page.fill("#chat-input textarea", CODE_PROMPT)
    page.click("#chat-send")
    page.wait_for_function("old => document.querySelector('#chat-run textarea').value !== old", arg=before)
