"""Several users and long runs in Chromium, on the shipped tiny model served from a models directory (two copies,
`a` and `b`, whose loading takes SWITCH_S more, so that a switch can be watched): two sessions' answers stream at
once; Race and Compare stop; a model switch holds sending and names its model; the chat's live round panel says
which run it shows, with its running figures, and no queue overlay dims it; limits are said in words. The chat's
screenshots at 1400×900 and on a phone are README screenshots (support.browser.doc_shot)."""
from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.browser import (
    NEEDS_BROWSER,
    choose,
    doc_shot,
    event_mark,
    new_page,
    open_params,
    painted,
    set_checked,
    set_number,
    settled,
    start_long_raw_run,
    wait_last_answer,
)
from support.live_server import free_port, serving

pytest_plugins = ["support.browser"]
pytestmark = [pytest.mark.browser, pytest.mark.slow, *NEEDS_BROWSER]

SWITCH_S = 3.0
LONG = "Write a Python function that reverses a string."   # the tiny model answers it up to max_new_tokens


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    from specscope.app.ui import mount_ui
    from specscope.backend.engine.cost_curve import FLAT
    from specscope.backend.engine.engine import Engine
    from specscope.backend.model.checkpoint import DEFAULT_CHECKPOINT, load_checkpoint
    from specscope.backend.server import create_app
    from specscope.backend.store import Store

    root = tmp_path_factory.mktemp("sessions")
    for name in ("a", "b"):
        shutil.copytree(DEFAULT_CHECKPOINT, root / "models" / name)

    def slow_build(folder: str | Path) -> Engine:
        time.sleep(SWITCH_S)
        return Engine(load_checkpoint(folder), num_slots=4096, cost_curve=FLAT)

    port = free_port()
    app = create_app(Engine(load_checkpoint(root / "models" / "a"), num_slots=4096, cost_curve=FLAT),
                     Store(f"sqlite:///{root / 'runs.db'}"), backend_url=f"ws://127.0.0.1:{port}", ui=mount_ui,
                     models_dir=root / "models", build=slow_build)
    with serving(app, port):
        yield f"http://127.0.0.1:{port}/"


def open_chat(browser, server: str, errors: list[str] | None = None, **viewport: int):
    page = new_page(browser, errors)
    if viewport:
        page.set_viewport_size(viewport)
    page.goto(server, wait_until="load")
    page.wait_for_selector("#ss-up")
    page.wait_for_selector("text=linear_spec:")
    return page


def answers(page) -> int:
    return page.locator("#chat-bot .bot").count()


def first_token(page, timeout: float) -> None:
    """Until the last answer shows text of its run (not the placeholder)."""
    page.wait_for_function("() => { const t = [...document.querySelectorAll('#chat-bot .bot')].pop()?.innerText"
                           " ?? ''; return t.trim() && !/^…$|waiting for the engine/.test(t.trim()); }",
                           timeout=timeout)


def test_two_sessions_stream_at_once(browser, server, errors) -> None:
    """B sends while A's long answer streams: B's message shows at once and B's answer streams and ends while A's
    still runs (the chat event used to run one session at a time)."""
    a, b = open_chat(browser, server, errors), open_chat(browser, server, errors)
    choose(b, "#chat-mode", "ar")
    b.wait_for_selector("text=ar:")
    open_params(b)
    set_number(b, "#param-max_new_tokens", 12)
    start_long_raw_run(a, "specfold", 900)
    first_token(a, 30_000)
    b.fill("#chat-input textarea", "Reverse: q w e r")
    b.press("#chat-input textarea", "Enter")
    b.locator("#chat-bot .user", has_text="Reverse: q w e r").wait_for(timeout=3_000)   # shown at once
    first_token(b, 10_000)
    wait_last_answer(b, "ar\\s*· TPF", timeout=15_000)
    assert "TPF" not in a.locator("#chat-bot .bot").last.inner_text(), "A's answer is still streaming"
    a.click("#chat-stop")
    wait_last_answer(a, "stopped", timeout=30_000)
    set_checked(a, "#param-raw", False)
    for page in (a, b):
        page.close()


def watch_live_panel(page) -> None:
    """Record, every frame: the live panel's label, how many token cells it draws, whether its progress overlay
    shows."""
    page.evaluate("""() => { window.__live = [];
        const tick = () => {
          const tracker = document.querySelector('#chat-live [data-testid=status-tracker]');
          window.__live.push({head: document.querySelector('#chat-live-head')?.innerText ?? '',
                              cells: document.querySelectorAll('#chat-live .ss-tok').length,
                              overlay: !!tracker && !tracker.classList.contains('hide')});
          if (!window.__stopLive) requestAnimationFrame(tick);
        };
        tick(); }""")


FIGURES = re.compile(r"run (r_\w+) · specfold on a · live · round \d+ · (\d+) tokens? · NFE (\d+) · TPF \d+\.\d\d · "
                     r"[\d.]+ tok/s")


def test_the_live_panel_names_its_run_with_running_figures_and_no_overlay(browser, server, errors) -> None:
    """A new run's panel drops the previous run's round (of another mode) and names the run it shows; while the
    run streams its tokens, NFE, TPF and tok/s count up; the queue's overlay never covers it. Screenshots."""
    page = open_chat(browser, server, errors, width=1400, height=900)
    choose(page, "#chat-mode", "linear_spec")
    page.wait_for_selector("text=linear_spec:")
    open_params(page)
    set_number(page, "#param-max_new_tokens", 12)
    page.fill("#chat-input textarea", "Reverse: a b c d")
    page.press("#chat-input textarea", "Enter")
    wait_last_answer(page, "linear_spec\\s*· TPF")
    previous = page.input_value("#chat-run textarea")
    assert previous in page.locator("#chat-live-head").inner_text()
    watch_live_panel(page)
    start_long_raw_run(page, "specfold", 900)
    page.wait_for_function("() => /· live · round [1-9]/.test(document.querySelector('#chat-live-head').innerText)")
    head = page.locator("#chat-live-head").inner_text()
    seen = FIGURES.search(head)
    assert seen and seen.group(1) == page.input_value("#chat-run textarea"), head
    page.wait_for_function("n => { const m = /(\\d+) tokens? · NFE (\\d+)/.exec(document.querySelector("
                           "'#chat-live-head').innerText); return m && Number(m[1]) > n; }", arg=int(seen.group(2)))
    frames = page.evaluate("() => { window.__stopLive = true; return window.__live; }")
    assert not any(f["overlay"] for f in frames), "the queue's overlay dimmed the live round"
    shown = [f for f in frames if f["cells"]]
    assert shown and all(re.search(r"run r_\w+ · \w+ on a", f["head"]) for f in shown), "a round without its run"
    after = frames[next(i for i, f in enumerate(frames) if previous not in f["head"]):]
    assert all(previous not in f["head"] and (not f["cells"] or "specfold on a" in f["head"]) for f in after)
    page.evaluate("() => window.scrollTo(0, 0)")
    doc_shot(page, "chat-1400x900")
    page.click("#chat-stop")
    wait_last_answer(page, "stopped", timeout=30_000)
    set_checked(page, "#param-raw", False)
    page.set_viewport_size({"width": 390, "height": 844})
    page.evaluate("() => window.scrollTo(0, 0)")
    painted(page)
    doc_shot(page, "chat-phone")
    page.close()


def test_a_fresh_phone_page_shows_the_message_box_on_its_first_screen(browser, server, errors) -> None:
    page = open_chat(browser, server, errors, width=390, height=844)
    box = page.locator("#chat-input textarea").bounding_box()
    assert box is not None and box["y"] + box["height"] < 844, box
    page.close()


def test_race_and_compare_stop(browser, server, errors) -> None:
    """Stop cancels both lanes of a race, and a comparison's running run with the ones still queued (shown as
    queued, never as running with 0 rounds); max_new_tokens past the cap is clamped as in the chat, not an error."""
    page = open_chat(browser, server, errors)
    page.get_by_role("tab", name="Race").click()
    set_number(page, "#race-max", 5000)
    page.wait_for_function("() => document.querySelector('#race-max input').value === '1024'")
    set_number(page, "#race-max", 900)
    page.fill("#race-input textarea", LONG)
    page.click("#race-start")
    page.wait_for_function("() => ['#race-a', '#race-b'].every(id => /[1-9]\\d* tokens .*· running/.test("
                           "document.querySelector(id).innerText))")
    page.click("#race-stop")
    page.wait_for_function("() => ['#race-a', '#race-b'].every(id => / · cancelled/.test("
                           "document.querySelector(id).innerText))", timeout=15_000)
    page.get_by_role("tab", name="Compare").click()
    page.fill("#cmp-prompt textarea", LONG)
    set_number(page, "#cmp-max-new", 900)
    page.click("#cmp-run")
    page.wait_for_selector("#cmp-status >> text=/running \\([1-9]/")
    status = page.locator("#cmp-status").inner_text()
    assert "queued" in status and "running (0 rounds)" not in status, status
    page.click("#cmp-stop")
    page.wait_for_selector("#cmp-status >> text=not run (stopped)", timeout=15_000)
    assert "cancelled" in page.locator("#cmp-status").inner_text()
    page.wait_for_selector("#cmp-table .ss-table")
    page.close()


def test_a_message_over_the_limit_is_refused_in_words(browser, server, errors) -> None:
    page = open_chat(browser, server, errors)
    assert "at most 16,000 characters" in page.locator("#chat-input").inner_text()
    page.fill("#chat-input textarea", "x" * 20_000)
    mark = event_mark(page)
    page.press("#chat-input textarea", "Enter")
    page.wait_for_selector("#chat-refused >> text=at most 16,000 characters")
    settled(page, mark)   # the queue's answering has come and gone: the refusal stays
    assert page.locator("#chat-refused").is_visible()
    assert answers(page) == 0 and len(page.input_value("#chat-input textarea")) == 20_000
    page.fill("#chat-input textarea", "Reverse: c b a")
    page.press("#chat-input textarea", "Enter")
    page.wait_for_selector("#chat-refused", state="detached")
    page.close()


def test_a_model_switch_holds_sending_and_answers_name_their_model(browser, server, errors) -> None:
    """While `b` loads the picker shows it and says so, Send is off and a message sent with Enter stays in the box;
    once `b` is served the message goes, and its answer's stats name model b."""
    page = open_chat(browser, server, errors)
    choose(page, "#chat-mode", "ar")
    page.wait_for_selector("text=ar:")
    open_params(page)
    set_number(page, "#param-max_new_tokens", 12)
    choose(page, "#model-pick", "b")
    page.wait_for_selector("#model-switching >> text=switching to b")
    page.wait_for_selector("#chat-send[disabled]")
    page.fill("#chat-input textarea", "Reverse: z y x")
    page.press("#chat-input textarea", "Enter")
    page.wait_for_selector("#ss-switching >> text=switching to b")   # a health tick since: the picker stays on b
    assert page.input_value("#model-pick input") == "b"
    assert answers(page) == 0 and page.input_value("#chat-input textarea") == "Reverse: z y x"
    page.wait_for_selector("#model-current >> text=serving b", timeout=30_000)
    page.wait_for_selector("#chat-send:not([disabled])")
    page.click("#chat-send")
    wait_last_answer(page, "ar\\s*· TPF")
    assert "model b" in page.locator("#chat-bot .bot").last.inner_text()
    page.close()


def test_no_console_errors(errors) -> None:
    assert errors == []

