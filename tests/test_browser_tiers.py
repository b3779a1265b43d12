"""Load tiers in Chromium, on a server whose draft tiers stop all drafting at any load (so no check hangs on
whether another client's run overlaps), while a long run of another client keeps it busy: the Race runs each mode as
it runs alone (isd drafts) unless "as served under load" is ticked, and then the isd pane says in how many rounds the
tier cut its drafting and why; a chat answer under the tiers says so in its stats."""
from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator

import pytest
from support.browser import CODE_PROMPT, NEEDS_BROWSER, PROMPT, chat, doc_shot, new_page, set_number
from support.live_server import ui_server
from websockets.sync.client import connect

pytest_plugins = ["support.browser"]  # the browser and errors fixtures
pytestmark = [pytest.mark.browser, *NEEDS_BROWSER]
NOTE = "load tier reduced drafting in"


@pytest.fixture(scope="module")
def server(loaded, tmp_path_factory) -> Iterator[dict]:
    with ui_server(loaded, tmp_path_factory.mktemp("tiers")) as served:
        served["engine"].scheduler.draft_tiers = [(64, 0)]   # no drafts at any load: a tiered run never drafts, so
        # the check does not hang on whether another client's run overlaps this one
        yield served


@pytest.fixture
def busy(server) -> Iterator[None]:
    """Another client's long runs, one after another for the whole test, each cancelled once the test ends."""
    started, done = threading.Event(), threading.Event()

    def client() -> None:
        while not done.is_set():
            with connect(server["ws"]) as ws:
                ws.send(json.dumps({"type": "generate", "prompt": CODE_PROMPT, "mode": "ar",
                                    "params": {"max_new_tokens": 1000, "raw": True}}))
                while not done.is_set() and json.loads(ws.recv())["type"] != "run_end":
                    started.set()
                ws.send(json.dumps({"type": "cancel"}))

    thread = threading.Thread(target=client)
    thread.start()
    assert started.wait(60)
    yield
    done.set()
    thread.join(60)


def race(page, served: bool) -> list[str]:
    """Race ar against isd on PROMPT (tiers as `served` says); the two panes' text once both are done."""
    page.get_by_role("tab", name="Race").click()
    page.wait_for_function("() => document.querySelector('#race-mode-b input').value === 'isd' && "
                           "document.querySelector('#race-mode-a input').value === 'ar'")   # the defaults
    set_number(page, "#race-max", 12)
    if page.is_checked("#race-served input") != served:
        page.click("#race-served input")
    assert page.is_checked("#race-served input") == served
    page.fill("#race-input textarea", PROMPT)
    before = [page.locator(pane).inner_text() for pane in ("#race-a", "#race-b")]
    page.click("#race-start")
    page.wait_for_function("""before => ['#race-a', '#race-b'].every((id, i) => {
                               const now = document.querySelector(id).innerText;   // this race's runs, not the last's
                               return / · done/.test(now) && (now.match(/r_[0-9a-f]{16}/) || [''])[0] !==
                                   (before[i].match(/r_[0-9a-f]{16}/) || [null])[0]; })""", arg=before,
                           timeout=120_000)
    return [page.locator(pane).inner_text() for pane in ("#race-a", "#race-b")]


def tpf(pane: str) -> float:
    found = re.search(r"TPF (\d+\.\d\d)", pane)
    assert found, pane
    return float(found.group(1))


def test_a_race_drafts_as_alone_by_default_and_says_what_the_tier_cut_when_served(browser, errors, server,
                                                                                  busy) -> None:
    page = new_page(browser, errors)
    page.goto(server["url"])
    page.wait_for_selector("#ss-up")
    ar, isd = race(page, served=False)
    assert tpf(isd) > 1 and NOTE not in ar + isd, isd         # another run is active, and isd still drafts
    ar, isd = race(page, served=True)
    assert tpf(isd) == 1 and NOTE not in ar, isd              # under the tier: plain decode steps, and it says so
    assert re.search(rf"{NOTE} \d+ rounds: drafting off with \d+ runs? active", isd), isd
    page.locator("#race-b").scroll_into_view_if_needed()
    doc_shot(page, "race")
    page.close()
    assert errors == []


def test_a_chat_answer_under_the_tier_says_so_in_its_stats(browser, errors, server, busy) -> None:
    page = new_page(browser, errors)
    page.goto(server["url"])
    page.wait_for_selector("#ss-up")
    chat(page, "isd")
    stats = page.locator("#chat-bot .bot").last.inner_text()
    assert "TPF 1.00" in stats and re.search(rf"{NOTE} \d+ rounds: drafting off with \d+ runs? active", stats), stats
    page.locator("#chat-bot .bot").last.scroll_into_view_if_needed()
    doc_shot(page, "chat-tier-note")
    page.close()
    assert errors == []
