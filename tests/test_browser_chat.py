"""A multi-turn conversation in Chromium on the real default model (`specscope serve` with no --model): the second
answer depends on the first turn ("And of Japan?" alone names no city), so the chat sends the whole conversation;
the message box keeps what the user types while an answer streams; answers render as Markdown (a code block);
only the modes the model can run are offered."""
from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from browser import NEEDS_BROWSER, choose, new_page, set_number, shot
from serve_process import Served

pytest_plugins = ["browser"]
pytestmark = [pytest.mark.browser, pytest.mark.real_model, pytest.mark.slow, pytest.mark.extended, *NEEDS_BROWSER]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("chat")
    served = Served(f"sqlite:///{root / 'runs.db'}", root / "serve.log", options=("--slots", "8192"))
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
    set_number(page, "#param-max_new_tokens", 24)
    first = say(page, "What is the capital of France?", 1)
    page.fill("#chat-input textarea", "And of Japan?")
    page.press("#chat-input textarea", "Enter")
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
