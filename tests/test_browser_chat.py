"""A multi-turn conversation in Chromium on the real default model (`specscope serve` with no --model): the second
answer depends on the first turn ("And of Japan?" alone names no city), so the chat sends the whole conversation;
the message box keeps what the user types while an answer streams; answers render as Markdown (a code block);
only the modes the model can run are offered. On the same model: a race of ar against quadratic, and a token's
recorded top-k alternatives in the visualizer (the README's screenshots)."""
from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from support.browser import ARTIFACTS, NEEDS_BROWSER, choose, new_page, open_params, set_number, shot
from support.serve_process import Served

pytest_plugins = ["support.browser"]
pytestmark = [pytest.mark.browser, pytest.mark.real_model, pytest.mark.slow, pytest.mark.extended, *NEEDS_BROWSER]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("chat")
    served = Served(f"sqlite:///{root / 'runs.db'}", root / "serve.log",
                    options=("--slots", "8192", "--cost-curve", "flat"))
    try:
        yield served.http
    finally:
        served.stop()


def say(page, text: str, turn: int) -> str:
    """Send `text` and return the answer's text once its stats show (the run ended)."""
    page.fill("#chat-input textarea", text)
    page.press("#chat-input textarea", "Enter")
    page.wait_for_function("n => document.querySelectorAll('#chat-bot .bot').length >= n", arg=turn)
    answer = page.locator("#chat-bot .bot").nth(turn - 1)
    answer.locator("text=/· TPF/").wait_for(timeout=120_000)
    return answer.inner_text()


def test_multi_turn_chat_on_the_default_model(browser, server) -> None:
    page = new_page(browser)
    page.goto(server + "/")
    page.wait_for_selector("#ss-up >> text=model smollm2-135m")
    choose(page, "#chat-mode", "quadratic")
    page.wait_for_selector("text=quadratic:")
    open_params(page)
    set_number(page, "#param-max_new_tokens", 24)
    first = say(page, "What is the capital of France?", 1)
    page.fill("#chat-input textarea", "And of Japan?")
    page.press("#chat-input textarea", "Enter")
    page.wait_for_function("() => document.querySelector('#chat-input textarea').value === ''")   # sent
    page.fill("#chat-input textarea", "typed while it streams")   # kept: redraws never clear the box
    page.wait_for_function("() => document.querySelectorAll('#chat-bot .bot').length >= 2")
    second = page.locator("#chat-bot .bot").nth(1)
    second.locator("text=/· TPF/").wait_for(timeout=120_000)
    assert page.input_value("#chat-input textarea") == "typed while it streams"
    assert "Paris" in first and "Tokyo" in second.inner_text()
    shot(page, "chat_real_model")
    runs = httpx.get(f"{server}/api/runs", params={"limit": 5}).json()
    latest = httpx.get(f"{server}/api/runs/{runs[0]['run_id']}/export").json()["events"][0]
    assert [m["role"] for m in latest["messages"]] == ["user", "assistant", "user"]
    assert latest["messages"][0]["content"] == "What is the capital of France?"
    page.click("#chat-clear")
    set_number(page, "#param-max_new_tokens", 64)
    say(page, "Write a Python function that reverses a list.", 1)
    code = page.locator("#chat-bot .bot").first.locator(".ss-md pre code")   # the answer's Markdown code block
    assert code.count() >= 1 and "def " in code.first.inner_text()
    page.close()


def test_race_on_the_default_model(browser, server) -> None:
    """ar against quadratic on one message: both stream to the end, and greedy quadratic answers as ar does."""
    page = new_page(browser)
    page.goto(server + "/")
    page.wait_for_selector("#ss-up >> text=model smollm2-135m")
    page.get_by_role("tab", name="Race").click()
    choose(page, "#race-mode-b", "quadratic")
    page.wait_for_function("() => document.querySelector('#race-mode-b input').value === 'quadratic'")
    set_number(page, "#race-max", 48)
    page.fill("#race-input textarea", "Write a Python function that adds two numbers.")
    page.click("#race-start")
    page.wait_for_function("() => ['#race-a', '#race-b'].every(id => / · (done|cancelled|error)/.test("
                           "document.querySelector(id).innerText))", timeout=180_000)
    panes = [page.locator(pane).inner_text() for pane in ("#race-a", "#race-b")]
    assert all(" · done" in p for p in panes), panes
    ids = [page.locator(pane).locator("code").first.inner_text() for pane in ("#race-a", "#race-b")]
    runs = [httpx.get(f"{server}/api/runs/{run_id}").json() for run_id in ids]
    assert [r["mode"] for r in runs] == ["ar", "quadratic"] and runs[0]["output"] == runs[1]["output"]
    assert "def " in runs[0]["output"]
    shot(page, "race_real_model")
    page.close()


def test_top_k_alternatives_on_the_default_model(browser, server) -> None:
    """A linear_spec run with trace_topk = 3 (over /v1): a drafted token's history lists each forward's three
    alternatives with entropy and margin."""
    body = {"model": "smollm2-135m:linear_spec", "max_tokens": 24, "specscope": {"params": {"trace_topk": 3}},
            "messages": [{"role": "user", "content": "What is the capital of France?"}]}
    reply = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=120).json()
    run_id = reply["specscope"]["run_id"]
    page = new_page(browser)
    page.goto(f"{server}/?run={run_id}&round=2")
    page.wait_for_function("id => document.querySelector('#viz-summary')?.innerText.includes(id)", arg=run_id)
    page.locator("#viz-grid .ss-block .ss-tok").nth(1).click()
    page.wait_for_selector("#viz-history table")
    history = page.locator("#viz-history").inner_text()
    assert "draft:" in history and "verify:" in history and "entropy" in history
    page.locator("#viz-history").screenshot(path=str(ARTIFACTS / "topk_real_model.png"))
    page.close()
