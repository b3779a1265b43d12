"""`specscope serve --models DIR` in Chromium: three model folders (the shipped checkpoint and two tiny random
Qwen3 models with its tokenizer), switched in the header picker, a run on each, and the Runs tab showing which
model (name · weights hash) each run used."""
from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.browser import NEEDS_BROWSER, chat, choose, new_page, shot, start_long_raw_run, wait_last_answer
from support.hf_tiny import save_hf
from support.serve_process import Served

from specscope.backend.model.checkpoint import DEFAULT_CHECKPOINT

pytest_plugins = ["support.browser"]  # the browser fixture
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.extended, *NEEDS_BROWSER]

RUNS = {"rand-a": "ar", "rand-b": "block_diffusion", "shipped": "linear_spec"}   # served first: rand-a


def random_qwen3(folder: Path, seed: int) -> None:
    """A tiny random Qwen3 with the shipped tokenizer, its mask and end tokens (so every mode can run)."""
    from transformers import Qwen3Config

    save_hf(Qwen3Config(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
                        tie_word_embeddings=True, mask_token_id=2, eos_token_id=1), folder, seed)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("picker")
    models = root / "models"
    shutil.copytree(DEFAULT_CHECKPOINT, models / "shipped")
    random_qwen3(models / "rand-a", seed=1)
    random_qwen3(models / "rand-b", seed=2)
    served = Served(f"sqlite:///{root / 'runs.db'}", root / "serve.log",
                    options=("--models", str(models), "--slots", "1024", "--threads", "1", "--cost-curve", "flat"))
    try:
        yield served.http
    finally:
        served.stop()


@pytest.fixture(scope="module")
def page(browser, server) -> Iterator:
    page = new_page(browser)
    page.goto(server + "/")
    page.wait_for_selector("#ss-up")
    yield page
    page.close()


def test_switch_models_run_each_and_list_which_model_ran(page, server) -> None:
    page.wait_for_selector("#model-current >> text=rand-a")
    page.click("#model-pick input")
    listed = sorted(t.replace("✓", "").strip() for t in page.get_by_role("option").all_inner_texts())
    assert listed == sorted([*RUNS, "smollm2-135m", "tiny"])   # the folders, then the models known by name
    page.keyboard.press("Escape")
    run_ids = {}
    for name, mode in RUNS.items():
        if name != "rand-a":
            choose(page, "#model-pick", name)
            page.wait_for_selector(f"#model-current >> text={name}")
        page.wait_for_selector(f"#ss-up >> text=model {name}")
        chat(page, mode)
        run_ids[name] = page.input_value("#chat-run textarea")
    shot(page, "models-picker")
    runs = {name: httpx.get(f"{server}/api/runs/{run_id}").json() for name, run_id in run_ids.items()}
    assert {name: run["model"] for name, run in runs.items()} == {name: name for name in RUNS}
    assert len({run["model_hash"] for run in runs.values()}) == 3
    page.get_by_role("tab", name="Runs").click()
    for name, run in runs.items():
        cells = page.locator("#runs-table [role=row]", has_text=run["run_id"])
        cells.wait_for()
        shown = cells.inner_text().split("\n")
        assert RUNS[name] in shown and f"{name} · {run['model_hash']}" in shown, shown
    shot(page, "models-runs")
    httpx.post(f"{server}/api/models/rand-a", timeout=60).raise_for_status()  # a switch made elsewhere shows up
    page.wait_for_selector("#model-current >> text=rand-a")
    page.wait_for_function("() => document.querySelector('#model-pick input').value === 'rand-a'")


def test_a_run_cancelled_by_a_model_switch_says_so(page, server) -> None:
    """An answer cut short by a model switch (made elsewhere) says so, not "stopped"."""
    page.get_by_role("tab", name="Chat").click()
    start_long_raw_run(page, "block_diffusion", 900)   # a random model unmasks a token a pass: still going
    httpx.post(f"{server}/api/models/rand-b", timeout=60).raise_for_status()
    wait_last_answer(page, "switched models")
    assert "stopped" not in page.locator("#chat-bot .bot").last.inner_text()
    run = httpx.get(f"{server}/api/runs/{page.input_value('#chat-run textarea')}").json()
    assert run["status"] == "cancelled"
