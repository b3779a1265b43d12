"""Playwright with the system Chromium, shared by the browser tests (`pytest_plugins = ["support.browser"]`): a module's
browser, its pages' console errors, new pages that record them and the event calls they make (so that a step waits
for the server to have answered it, never for a fixed time), and the UI steps several modules take (chat in a mode,
set a number or a checkbox, pick from a dropdown, a screenshot). Modules mark themselves
`pytestmark = [pytest.mark.browser, *NEEDS_BROWSER]`, so `-m "not browser"` leaves them out and they skip (with the
reason) where Chromium or Playwright is missing."""
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


EVENT_WATCH = """(() => {
  const events = window.__ssEvents = [];
  const byId = new Map();
  const completed = new Set();
  const finish = (id) => { if (byId.has(id)) byId.get(id).done = true; else completed.add(id); };
  const read = async (response) => {   // the queue's server-sent messages: which events completed
    const reader = response.body.getReader();
    const text = new TextDecoder();
    let buffer = '';
    for (;;) {
      const {done, value} = await reader.read();
      if (done) return;
      buffer += text.decode(value, {stream: true});
      const messages = buffer.split('\\n\\n');
      buffer = messages.pop();
      for (const line of messages.flatMap((m) => m.split('\\n')).filter((l) => l.startsWith('data:'))) {
        try {
          const m = JSON.parse(line.slice(5));
          if (m.msg === 'process_completed') finish(m.event_id);
        } catch (e) { /* not an event's message */ }
      }
    }
  };
  const fetch = window.fetch;
  window.fetch = function (...args) {
    const url = String((args[0] && args[0].url) || args[0]);
    const kind = url.includes('/run/predict') ? 'predict' : url.includes('/queue/join') ? 'queued' : null;
    if (!kind) {
      const answer = fetch.apply(this, args);
      return url.includes('/queue/data') ? answer.then((r) => { read(r.clone()).catch(() => {}); return r; }) : answer;
    }
    let body = {};
    try { body = JSON.parse(args[1].body); } catch (e) { /* no JSON body: nothing to match */ }
    const event = {kind, fn: body.fn_index, data: body.data || [], done: false};
    events.push(event);
    return fetch.apply(this, args).then((r) => {
      if (kind === 'predict') event.done = true;
      else r.clone().json().then((j) => {
        byId.set(j.event_id, event);
        if (completed.has(j.event_id)) event.done = true;
      }, () => { event.done = true; });
      return r;
    }, (e) => { event.done = true; throw e; });
  };
})();"""
"""Records every event call the page makes to the server, with its function (fn_index), its input data and whether
it has been answered: unqueued ones (Gradio's /run/predict: a widget's change, submit or blur handler) when their
answer comes, queued ones (/queue/join) when the queue's stream says they completed. A test then waits for what an
action set off to be answered (`set_number`, `settled`) instead of sleeping."""

SETTLED = """(mark) => {
  if (!window.__ssEvents) return true;   // a page without EVENT_WATCH: nothing to wait for
  const deps = window.gradio_config.dependencies;
  const ticks = new Set(deps.filter((d) => d.targets.some(([, on]) => on === 'tick')).map((d) => d.id));
  const events = window.__ssEvents.slice(mark).filter((e) => !ticks.has(e.fn));
  return events.every((e) => e.done) && events.every((e) => deps.every((d) => d.trigger_after !== e.fn ||
    !d.backend_fn || d.trigger_only_on_failure || events.some((f) => f.fn === d.id)));
}"""
"""Whether every event the page sent since `mark` (timer ticks aside) has been answered, and those that follow
them (`.then`) have been sent and answered too."""


def event_mark(page: Any) -> int:
    """A mark in the page's event calls, for `settled`."""
    return page.evaluate("() => (window.__ssEvents || []).length")


def settled(page: Any, mark: int, timeout: float | None = None) -> None:
    """Until every event the page sent since `mark` and what follows each has been answered (SETTLED)."""
    page.wait_for_function(SETTLED, arg=mark, **({} if timeout is None else {"timeout": timeout}))


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
    page.add_init_script(EVENT_WATCH)
    if errors is not None:
        page.add_init_script(TOAST_WATCH)
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
    return page


def painted(page: Any) -> None:
    """Until the browser has painted what the page holds now (two animation frames)."""
    page.evaluate("() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))")


def shot(page: Any, name: str) -> None:
    painted(page)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def doc_shot(page: Any, name: str) -> None:
    """A README screenshot: into docs/screenshots/ under `make screenshots`, else into the artifacts, so that a
    test run leaves the work tree as it was."""
    folder = DOC_SHOTS if os.environ.get("SPECSCOPE_DOC_SHOTS") else ARTIFACTS
    page.screenshot(path=str(folder / f"{name}.png"))


ANSWERED = """({mark, value, box, remembers}) => {
  if (!window.__ssEvents) return true;   // a page without EVENT_WATCH: nothing to wait for
  const calls = window.__ssEvents.slice(mark).filter((e) => e.kind === 'predict');
  if (calls.some((c) => !c.done)) return false;
  const answered = (v, inputs) => calls.some((c) => c.data.length === inputs && Number(c.data[0]) === Number(v));
  const shown = document.querySelector(box).value;
  return answered(value, 1) && (!remembers || (answered(value, 2) &&
                                              (Number(shown) === Number(value) || answered(shown, 2))));
}"""
"""Whether the handlers a number box's new value set off have been answered (EVENT_WATCH's calls since `mark`):
the box's own (Enter's clamp, or a slider's change) for `value`, and where the box is a chat parameter
(`remembers`), the change that remembers `value` for the run and the one that remembers the clamped value the box
shows, if other."""


def set_number(page: Any, selector: str, value: float) -> None:
    """Type `value` into the number box under `selector` and press Enter; return once the server has answered what
    that set off (ANSWERED): the value a run takes, and the box shows, is then the one the server clamped."""
    box = page.locator(f"{selector} input[type=number]")
    before = box.input_value()
    if before and float(before) == float(value):
        return
    mark = event_mark(page)
    box.fill(str(value))
    box.press("Enter")
    page.wait_for_function(ANSWERED, arg={"mark": mark, "value": value, "box": f"{selector} input[type=number]",
                                          "remembers": selector.startswith("#param-")})


REMEMBERED = """(mark) => {
  if (!window.__ssEvents) return true;   // a page without EVENT_WATCH: nothing to wait for
  const calls = window.__ssEvents.slice(mark).filter((e) => e.kind === 'predict');
  return calls.length > 0 && calls.every((c) => c.done);
}"""


def set_checked(page: Any, selector: str, on: bool = True) -> None:
    """Tick (or untick) the chat parameter's checkbox under `selector`; return once the server has remembered it
    for the run (its change answered)."""
    box = page.locator(f"{selector} input[type=checkbox]")
    if box.is_checked() == on:
        return
    mark = event_mark(page)
    box.set_checked(on)
    page.wait_for_function(REMEMBERED, arg=mark)


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
    set_checked(page, "#param-raw")
    before = page.input_value("#chat-run textarea")
    page.fill("#chat-input textarea", CODE_PROMPT)
    page.click("#chat-send")
    page.wait_for_function("old => document.querySelector('#chat-run textarea').value !== old", arg=before)
