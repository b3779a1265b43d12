"""The UI in a real browser (Playwright + the system Chromium): chat, visualizer, compare, runs, XSS, outages.

Screenshots of every view land in tests/artifacts/ (git-ignored).
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from live_server import free_port, serving

CHROMIUM = "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                reason=f"system Chromium not found at {CHROMIUM} (apt-get install chromium)")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).parent / "artifacts"
PROMPT = "Reverse: q w e r t y u i"   # eight answer tokens: ar makes a run of several rounds
XSS = "<script>window.__xss = 1</script>"
TIMEOUT_MS = 30_000


def store_xss_run(engine, store) -> str:
    """A stored run whose prompt, token pieces and output text hold markup."""
    from backend.tracing import RecordingTracer

    tracer = RecordingTracer()
    engine.generate(PROMPT, "linear_spec", {"max_new_tokens": 8}, tracer=tracer)
    run_id = "r_xss0000000000001"
    events = [dict(e, run_id=run_id) for e in tracer.events]
    events[0]["prompt"] = XSS
    events[0]["pieces"] = [XSS, *events[0]["pieces"][1:]]
    events[-1]["text"] = f'<img src=x onerror="window.__xss = 2">{XSS}'
    run = {"run_id": run_id, "created_at": datetime.now(UTC).isoformat(), "mode": "linear_spec", "model": "tiny",
           "params": events[0]["params"], "prompt": XSS, "status": "done", "output": events[-1]["text"],
           "metrics": events[-1]["metrics"], "n_rounds": 0, "n_tokens": 0}
    store.insert_run(run, events)
    return run_id


def store_long_run(store, n_rounds: int = 2000) -> str:
    """A synthetic stored `ar`-shaped run of n_rounds one-token rounds (more than this model's context allows)."""
    from backend.tracing import KVEvent, Phase, RecordingTracer, RoundEvent

    tracer = RecordingTracer(run_id="r_long000000000001", sink=store.record)
    tracer.emit("run_start", {"mode": "ar", "params": {"max_new_tokens": n_rounds}, "model": "tiny",
                              "prompt": "long", "prompt_ids": [5], "pieces": ["long"]})
    tokens = [10 + r % 50 for r in range(n_rounds)]
    for r, tok in enumerate(tokens):
        tracer.kv(KVEvent("alloc", [r], [r], r))
        tracer.kv(KVEvent("commit", [r], [r], r))
        tracer.round(RoundEvent(round=r, phases=[Phase("decode", "causal", False, 1, 1.0)], block_start=r + 1,
                                tokens=[tok], states=["accepted"], conf=[0.5], accepted_len=1, committed=[tok],
                                nfe=1))
    tracer.kv(KVEvent("free", list(range(n_rounds)), list(range(n_rounds)), n_rounds, "finished"))
    tracer.emit("run_end", {"status": "done", "output_ids": tokens, "text": "synthetic",
                            "metrics": {"nfe": n_rounds, "tokens": n_rounds, "tpf": 1.0}})
    return tracer.run_id


@pytest.fixture(scope="module")
def loaded_engine(loaded):
    from backend.engine.engine import Engine
    return Engine(loaded, num_slots=4096)


@pytest.fixture(scope="module")
def server(loaded_engine, tmp_path_factory) -> Iterator[dict]:
    from backend.server import create_app
    from backend.store import Store

    port = free_port()
    store = Store(f"sqlite:///{tmp_path_factory.mktemp('ui') / 'runs.db'}")
    xss_run = store_xss_run(loaded_engine, store)
    long_run = store_long_run(store)
    app = create_app(loaded_engine, store, backend_url=f"ws://127.0.0.1:{port}")
    with serving(app, port):
        yield {"url": f"http://127.0.0.1:{port}/", "xss_run": xss_run, "long_run": long_run}


@pytest.fixture(scope="module")
def browser() -> Iterator:
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def errors() -> list[str]:
    """Console errors and uncaught exceptions of the shared page."""
    return []


@pytest.fixture(scope="module")
def page(browser, server, errors) -> Iterator:
    """One page for the whole flow."""
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(TIMEOUT_MS)
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server["url"])
    page.wait_for_selector("#ss-up")
    yield page
    page.close()


def shot(page, name: str) -> None:
    page.wait_for_timeout(300)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def set_number(page, selector: str, value: int) -> None:
    box = page.locator(f"{selector} input[type=number]")
    box.fill(str(value))
    box.press("Enter")
    page.wait_for_timeout(300)


def choose(page, dropdown: str, option: str) -> None:
    page.click(f"{dropdown} input")
    page.get_by_role("option", name=option, exact=True).click()


def chat(page, mode: str) -> None:
    choose(page, "#chat-mode", mode)
    page.wait_for_function("m => document.querySelector('#chat-mode input').value === m", arg=mode)
    page.wait_for_selector(f"text={mode}:")  # that mode's parameters have rendered
    set_number(page, "#param-max_new_tokens", 12)
    answers = page.locator("#chat-bot .bot").count()
    page.fill("#chat-input textarea", PROMPT)
    page.press("#chat-input textarea", "Enter")
    page.wait_for_function("n => document.querySelectorAll('#chat-bot .bot').length > n", arg=answers)
    page.wait_for_selector(f"#chat-bot .bot:last-of-type >> text=/{mode}\\s*· TPF/")


def round_label(page) -> str:
    return page.locator("#viz-grid .ss-round-head b").first.inner_text()


def cursor_x(page, plot: str) -> float:
    return page.evaluate(f"() => document.querySelector('{plot} .js-plotly-plot').layout.shapes[0].x0")


def test_chat_streams_in_two_modes(page) -> None:
    chat(page, "linear_spec")
    chat(page, "ar")  # the visualizer test opens this last run (one round per token)
    stats = page.locator("#chat-bot .bot").all_inner_texts()
    assert any("linear_spec · TPF" in s for s in stats) and any("ar · TPF" in s for s in stats)
    assert page.locator("#chat-live .ss-tok").count() > 0
    assert page.input_value("#chat-run textarea").startswith("r_")
    shot(page, "chat")


def test_visualizer_steps_and_moves_cursor(page) -> None:
    page.click("#chat-open")
    page.wait_for_selector("#viz-grid .ss-tok")
    page.wait_for_selector("#viz-accepted .js-plotly-plot")
    assert round_label(page) == "round 0"
    page.click("#viz-next")
    page.wait_for_function("() => document.querySelector('#viz-grid .ss-round-head b').innerText === 'round 1'")
    assert cursor_x(page, "#viz-accepted") == 1
    page.locator("#viz-summary").click()
    page.keyboard.press("ArrowRight")
    page.wait_for_function("() => document.querySelector('#viz-grid .ss-round-head b').innerText === 'round 2'")
    page.click("#viz-prev")
    page.wait_for_function("() => document.querySelector('#viz-grid .ss-round-head b').innerText === 'round 1'")
    page.wait_for_function("() => document.querySelector('#viz-accepted .js-plotly-plot').layout.shapes[0].x0 == 1")
    page.wait_for_selector("#viz-kv .js-plotly-plot")
    shot(page, "visualizer")
    set_number(page, "#viz-speed", 10)
    page.click("#viz-play")  # autoplay runs to the last round, then stops
    last = page.evaluate("() => document.querySelector('#viz-slider input[type=range]').max")
    page.wait_for_function("n => document.querySelector('#viz-grid .ss-round-head b').innerText === 'round ' + n",
                           arg=last)


def test_compare_three_modes(page) -> None:
    page.get_by_role("tab", name="Compare").click()
    set_number(page, "#cmp-max-new", 12)
    page.click("#cmp-run")
    page.wait_for_selector("#cmp-table .ss-table")
    assert page.locator("#cmp-table tbody tr").count() == 3
    table = page.locator("#cmp-table").inner_text()
    assert "reference" in table and ("as reference" in table or "from reference" in table)
    assert "== ar" in table or "≠ ar" in table  # linear_spec's lossless claim, checked against the ar run
    page.wait_for_selector("#cmp-chart .js-plotly-plot")
    assert page.evaluate("() => document.querySelector('#cmp-chart .js-plotly-plot').data.length") == 3
    assert page.locator("#cmp-diffs .ss-diff").count() == 3
    page.fill("#cmp-label textarea", "three modes")
    page.click("#cmp-save")
    page.wait_for_selector("#cmp-status >> text=Saved as")
    shot(page, "compare")
    page.click("#cmp-open")  # the saved comparison (selected after saving) reopens from the store
    page.wait_for_selector("#cmp-status >> text=Comparison three modes")
    assert page.locator("#cmp-table tbody tr").count() == 3


def test_runs_filter_export_delete(page) -> None:
    page.get_by_role("tab", name="Runs").click()
    page.wait_for_function("() => document.querySelector('#runs-table').innerText.includes('block_diffusion')")
    choose(page, "#runs-mode", "ar")
    page.wait_for_function("() => !document.querySelector('#runs-table').innerText.includes('block_diffusion')")
    page.locator("#runs-table span.text").filter(has_text=re.compile(r"^r_")).first.click()
    page.wait_for_function("() => document.querySelector('#runs-selected textarea').value.startsWith('r_')")
    page.click("#runs-export-perfetto")
    page.wait_for_selector("#runs-message >> text=Exported")
    page.wait_for_selector("#runs-file a")
    shot(page, "runs")
    doomed = page.input_value("#runs-selected textarea")
    page.click("#runs-delete")
    page.wait_for_selector("#runs-message >> text=Deleted")
    assert doomed not in page.locator("#runs-table").inner_text()


def open_in_visualizer(page, run_id: str) -> None:
    page.get_by_role("tab", name="Visualizer").click()
    box = page.locator("#viz-run input")
    box.fill(run_id)
    box.press("Enter")


def test_stored_markup_is_shown_as_text(page, server) -> None:
    open_in_visualizer(page, server["xss_run"])
    page.wait_for_selector("#viz-summary >> text=window.__xss")
    page.wait_for_selector("#viz-grid .ss-tok")
    assert page.evaluate("() => window.__xss") is None
    assert XSS in page.locator("#viz-summary").inner_text()
    assert "<script>windo…" in page.locator("#viz-grid").inner_text()  # a long piece is cut in its cell
    assert XSS in page.locator("#viz-grid .ss-tok").first.get_attribute("title")  # and whole in its hover
    assert page.locator("#viz-grid script, #viz-summary script, #viz-summary img").count() == 0
    shot(page, "xss")


def test_a_2000_round_run_opens_and_steps(page, server) -> None:
    open_in_visualizer(page, server["long_run"])
    page.wait_for_selector("#viz-summary >> text=2000 rounds")
    page.wait_for_selector("#viz-kv .js-plotly-plot")
    page.click("#viz-next")
    page.wait_for_function("() => document.querySelector('#viz-grid .ss-round-head b').innerText === 'round 1'")
    assert page.evaluate("() => document.querySelector('#viz-accepted .js-plotly-plot').data[0].x.length") == 2000
    shot(page, "long_run")


def test_bench_tab_shows_the_stored_benchmarks(page) -> None:
    page.get_by_role("tab", name="Bench").click()
    page.wait_for_function("() => document.querySelector('#bench-modes').innerText.includes('specfold')")
    assert "vs block_diffusion" in page.locator("#bench-modes").inner_text()
    page.wait_for_selector("#bench-speedup .js-plotly-plot")
    assert page.locator("#bench-summary").inner_text().startswith("Modes: 30 prompts")
    shot(page, "bench")


def test_choice_parameter_is_a_dropdown_and_reaches_the_run(page) -> None:
    page.get_by_role("tab", name="Chat").click()
    choose(page, "#chat-mode", "specfold")
    page.wait_for_selector("text=specfold:")
    assert page.input_value("#param-backend input") == "torch"
    choose(page, "#param-backend", "triton")
    before = page.input_value("#chat-run textarea")
    chat(page, "specfold")
    page.wait_for_function("old => document.querySelector('#chat-run textarea').value !== old", arg=before)
    run_id = page.input_value("#chat-run textarea")
    run = httpx.get(f"{page.url.rstrip('/')}/api/runs/{run_id}").json()
    assert run["mode"] == "specfold" and run["params"]["backend"] == "triton"


def test_no_console_errors(page, errors) -> None:
    assert errors == []


def test_backend_unavailable_then_recovery(browser, loaded_engine, tmp_path) -> None:
    from app.ui import mount_ui
    from backend.server import create_app
    from backend.store import Store

    ui_port, backend_port = free_port(), free_port()
    ui_app = mount_ui(FastAPI(), f"ws://127.0.0.1:{backend_port}")
    backend = create_app(loaded_engine, Store(f"sqlite:///{tmp_path / 'b.db'}"), ui=False)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(TIMEOUT_MS)
    with serving(ui_app, ui_port):
        page.goto(f"http://127.0.0.1:{ui_port}/")
        page.wait_for_selector("#ss-down >> text=backend unavailable")
        shot(page, "unavailable")
        with serving(backend, backend_port):
            page.wait_for_selector("#ss-up")
            page.wait_for_selector("text=linear_spec:")  # modes loaded once the backend came up
            shot(page, "recovered")
        page.wait_for_selector("#ss-down")
        page.close()
