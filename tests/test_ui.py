"""The UI without a browser: the backend client (addresses, outages, a live server) and mounting on FastAPI."""
from __future__ import annotations

import asyncio

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from support.live_server import free_port, serving
from support.modes import LONG_RAW_PROMPT

from specscope.app.client import BackendError, BackendUnavailable, Client, base_urls
from specscope.app.plot import PLOTLY_ROUTE
from specscope.app.tabs.chat import REDRAW_EVERY_S, REDRAW_MAX_S, mode_params, param_component, redraw_interval
from specscope.app.tabs.viz import FOLLOW_FAILURES, follow_events
from specscope.app.trace import RunTrace
from specscope.app.ui import mount_ui, picker_hint, status_html


def test_base_urls() -> None:
    assert base_urls("ws://h:1") == ("http://h:1", "ws://h:1")
    assert base_urls("https://h/prefix/") == ("https://h/prefix", "wss://h/prefix")
    assert base_urls("h:2") == ("http://h:2", "ws://h:2")
    with pytest.raises(ValueError):
        base_urls("ftp://h")


def test_dead_backend_is_unavailable() -> None:
    client = Client(f"ws://127.0.0.1:{free_port()}", timeout=2)
    with pytest.raises(BackendUnavailable, match="backend unavailable"):
        client.health()

    async def drain() -> None:
        async for _ in client.generate("hi", "ar"):
            pass

    with pytest.raises(BackendUnavailable, match="backend unavailable"):
        asyncio.run(drain())
    assert "refused" in status_html(None, "refused") and "ss-down" in status_html(None, "<x>")
    assert "&lt;x&gt;" in status_html(None, "<x>")


def test_status_banner_says_when_the_store_does_not_answer() -> None:
    health = {"model": "tiny", "active_runs": 1, "pool": {"used": 3, "slots": 9}}
    assert "ss-store-down" not in status_html({**health, "store": {"status": "ok"}})
    down = status_html({**health, "store": {"status": "unavailable", "unavailable_s": 4.0}})
    assert "ss-up" in down and "ss-store-down" in down and "not answering" in down


def stub_app() -> FastAPI:
    app = FastAPI()

    @app.get("/api/health")
    def health() -> dict:
        return {"status": "ok", "model": "stub"}

    return app


def test_mount_keeps_api_routes() -> None:
    app = mount_ui(stub_app(), "ws://127.0.0.1:1")
    with TestClient(app) as http:
        assert http.get("/api/health").json() == {"status": "ok", "model": "stub"}
        page = http.get("/")
        assert page.status_code == 200 and "specscope" in page.text
        assert http.get("/config").status_code == 200
        plotly_js = http.get(PLOTLY_ROUTE)
        assert plotly_js.status_code == 200 and "javascript" in plotly_js.headers["content-type"]
        assert len(plotly_js.content) > 1_000_000, "the plotly package's own plotly.min.js"


def test_param_widgets_and_values() -> None:
    specs = [{"name": "m", "params": [
        {"name": "max_new_tokens", "type": "int", "default": 64, "min": 1, "max": 4096, "help": ""},
        {"name": "seed", "type": "int", "default": 0, "min": 0, "max": 2**31 - 1, "help": ""},
        {"name": "threshold", "type": "float", "default": 0.9, "min": 0.0, "max": 1.0, "help": ""},
        {"name": "lora", "type": "bool", "default": True, "min": None, "max": None, "help": ""}]}]
    kinds = [type(param_component(p, p["name"])).__name__ for p in specs[0]["params"]]
    assert kinds == ["Number", "Number", "Slider", "Checkbox"]
    assert param_component(specs[0]["params"][0], "k", 5).value == 5, "the user's earlier choice, not the default"
    assert param_component(specs[0]["params"][0], "k").value == 64
    chosen = {"m": {"max_new_tokens": 16.0, "threshold": 1, "lora": False, "seed": None}}
    assert mode_params(specs, "m", chosen) == {"max_new_tokens": 16, "threshold": 1.0, "lora": False}
    assert mode_params(specs, "other", chosen) == {}
    out_of_range = {"m": {"max_new_tokens": 99999, "seed": -3}}
    assert mode_params(specs, "m", out_of_range) == {"max_new_tokens": 4096, "seed": 0}


def test_client_against_live_server(engine, tmp_path) -> None:
    from specscope.backend.server import create_app
    from specscope.backend.store import Store

    port = free_port()
    app = create_app(engine, Store(f"sqlite:///{tmp_path / 'ui.db'}"))
    client = Client(f"ws://127.0.0.1:{port}")

    async def run(mode: str) -> list[dict]:
        return [e async for e in client.generate("What is 1 + 2?", mode, {"max_new_tokens": 6})]

    async def bad() -> list[dict]:
        return [e async for e in client.generate("hi", "no_such_mode")]

    async def stopped() -> list[dict]:
        seen: list[dict] = []
        params = {"max_new_tokens": 512, "raw": True}      # block_diffusion runs on for ~2.5 s: stopped mid-run
        async for e in client.generate(LONG_RAW_PROMPT, "block_diffusion", params, stop=lambda: len(seen) > 3):
            seen.append(e)
        return seen

    async def replayed(run_id: str, since: int = 0) -> list[dict]:
        return [e async for e in client.replay(run_id, since)]

    with serving(app, port):
        assert client.health()["status"] == "ok"
        assert {"ar", "linear_spec"} <= {m["name"] for m in client.modes()}
        model, pieces = client.vocab()
        assert model == engine.model_name and len(pieces) > 100
        events = asyncio.run(run("ar"))
        assert events[0]["type"] == "run_start" and events[-1]["type"] == "run_end"
        run_id = events[-1]["run_id"]
        trace = client.trace(run_id)
        assert trace.status == "done" and trace.rounds and trace.kv
        assert client.runs(mode="ar")[0]["run_id"] == run_id
        assert client.rounds(run_id, 0, 2)[0]["round"] == 0
        assert b"traceEvents" in client.export(run_id, "perfetto")
        other = asyncio.run(run("linear_spec"))[-1]["run_id"]
        made = client.create_comparison("pair", "What is 1 + 2?", [run_id, other])
        assert client.comparison(made["comparison_id"])["run_ids"] == [run_id, other]
        assert asyncio.run(bad())[-1]["type"] == "error"
        end = asyncio.run(stopped())[-1]  # stop() sends cancel; the stream still ends with the run's run_end
        assert end["type"] == "run_end" and end["status"] == "cancelled"
        replay = asyncio.run(replayed(run_id))
        assert replay == events
        assert [e["seq"] for e in asyncio.run(replayed(run_id, 3))] == [e["seq"] for e in events if e["seq"] >= 3]
        client.delete_run(other)
        with pytest.raises(BackendError, match="404"):
            client.run(other)


def test_token_protects_the_ui() -> None:
    app = mount_ui(stub_app(), "ws://127.0.0.1:1", token="s3cret")
    with TestClient(app) as http:
        assert http.get("/config").status_code == 401
        assert http.post("/login", data={"username": "me", "password": "wrong"}).status_code == 400
        assert http.post("/login", data={"username": "me", "password": "s3cret"}).status_code == 200
        assert http.get("/config").status_code == 200


class DroppingClient:
    """A replay stream that drops (BackendUnavailable) after its first event `drops` times, then serves the rest."""

    def __init__(self, events: list[dict], drops: int):
        self.events, self.drops, self.asked_from = events, drops, []

    async def replay(self, run_id: str, since_seq: int = 0):
        self.asked_from.append(since_seq)
        for event in self.events[since_seq:]:
            yield event
            if self.drops:
                self.drops -= 1
                raise BackendUnavailable("stream dropped")


def run_events(n_rounds: int) -> list[dict]:
    rounds = [{"type": "round", "seq": 1 + k, "round": k, "run_id": "r"} for k in range(n_rounds)]
    return [{"type": "run_start", "seq": 0, "run_id": "r"}, *rounds,
            {"type": "run_end", "seq": n_rounds + 1, "run_id": "r", "status": "cancelled"}]


async def followed(client: DroppingClient) -> RunTrace:
    trace = RunTrace(run_id="r")
    async for _ in follow_events(client, trace):  # type: ignore[arg-type]
        pass
    return trace


def test_live_follow_resumes_a_dropped_stream(monkeypatch) -> None:
    monkeypatch.setattr("specscope.app.tabs.viz.FOLLOW_RETRY_S", 0.0)
    client = DroppingClient(run_events(3), drops=2)
    trace = asyncio.run(followed(client))
    assert trace.status == "cancelled" and len(trace.rounds) == 3
    assert client.asked_from == [0, 1, 2]  # each reconnect asks from the event after the last one taken
    with pytest.raises(BackendUnavailable):  # a backend that keeps dropping ends the follow
        asyncio.run(followed(DroppingClient(run_events(9), drops=FOLLOW_FAILURES)))


def test_a_growing_answer_is_redrawn_less_often_within_bounds() -> None:
    """The chat's redraw interval grows with the answer it re-renders, from the shortest to the longest."""
    sizes = [0, 400, 2_000, 4_000, 8_000, 100_000]
    intervals = [redraw_interval("x" * n) for n in sizes]
    assert intervals == sorted(intervals) and intervals[0] == REDRAW_EVERY_S and intervals[-1] == REDRAW_MAX_S
    assert REDRAW_EVERY_S < intervals[3] < REDRAW_MAX_S


def test_the_model_card_shows_its_held_out_figures_as_a_table() -> None:
    """A card's adapter facts: text as text, a mapping of records (the held-out figures per stage) as a table
    with a column per field, numbers right-aligned; never raw JSON."""
    from specscope.app.tabs.card import card_html

    heldout = {"untrained": {"block8": 1.692, "answers": 16}, "step 240": {"block8": 2.681, "answers": 16}}
    shown = card_html({"model": "m", "card": {"summary": "s", "adapter": {"what": "a <LoRA>", "heldout": heldout}}})
    assert "{" not in shown and "a &lt;LoRA&gt;" in shown
    assert "<th>block8</th><th>answers</th>" in shown and "<td>step 240</td>" in shown
    assert '<td class="ss-num">2.681</td>' in shown


def test_the_model_card_says_how_its_cost_curve_was_measured() -> None:
    from specscope.app.tabs.card import card_html
    from specscope.backend.engine.cost_curve import FLAT, CostCurve, Provenance

    busy = Provenance("2026-01-02T03:04:05+00:00", 3.5, 3.7, 1.25, 2, 2, 0.4, "load average 3.70 is above 0.5 of 2 "
                      "CPUs", cached=False)
    shown = card_html({"model": "m", "card": None, "matmul": "float32",
                       "cost_curve": CostCurve({1: 8.6, 2: 9.0}, busy).to_json()})
    assert 'id="ss-cost-provenance"' in shown and "measured 2026-01-02T03:04:05+00:00 in 1.2 s on 2 CPUs" in shown
    assert "load average 3.50 before and 3.70 after" in shown and "busy (load average 3.70" in shown
    assert "it is not kept" in shown
    kept = CostCurve({1: 8.6, 2: 9.0}, Provenance("2026-01-02T03:04:05+00:00", 0.1, 0.2, 1.0, 2, 2, 0.02, None,
                                                     cached=True, source="cache")).to_json()
    assert "Read from this machine&#x27;s cache" in card_html({"model": "m", "cost_curve": kept})
    assert "rows are priced as free" in card_html({"model": "m", "cost_curve": FLAT.to_json()})


def test_code_without_fences_keeps_its_whitespace_and_limits_are_said_in_words() -> None:
    from specscope.app.limits import clamp_max_new, too_long
    from specscope.app.tabs.chat import answer, code_shaped

    code = "def f(x):\n    return x\n\n\nclass A:\n    pass"
    assert code_shaped(code) and not code_shaped("Some text.\n\n- a list\n  - nested") and not code_shaped(
        "```python\ndef f():\n    pass\n```")
    trace = RunTrace.from_events([{"type": "run_start", "run_id": "r_1", "mode": "ar"},
                                  {"type": "round", "run_id": "r_1", "round": 0, "text_delta": code}])
    assert "&#10;&#32;&#32;&#32;&#32;return" in answer(trace, done=False)   # preformatted, indentation kept
    failed = RunTrace.from_events([{"type": "error", "run_id": "r_2", "code": "bad_message", "message": "too long"}])
    assert "(empty)" not in answer(failed, done=True) and "too long" in answer(failed, done=True)
    assert too_long("x" * 16_000) is None and "at most 16,000 characters" in (too_long("x" * 20_000) or "")
    assert [clamp_max_new(v) for v in (5000, 0, None, 12.4)] == [1024, 1, 1, 12]


def test_the_mode_pickers_mark_the_modes_whose_output_is_lossy() -> None:
    """Lossy by the registry: a mode that is not exact and whose lossless claims do not lead back to an exact one."""
    from specscope.backend.engine.modes import describe_modes
    specs = describe_modes()
    lossy = {m["name"] for m in specs if m["lossy"]}
    assert {"block_diffusion", "spiffy", "specfold"} <= lossy and not lossy & {"ar", "isd", "linear_spec", "quadratic"}
    hint = picker_hint(specs, ["x (no mask token)"]) or ""
    assert hint.startswith("lossy (output may differ from the model's greedy decode): ") and "block_diffusion" in hint
    assert "isd" not in hint.split("·")[0] and hint.endswith("not offered for this model: x (no mask token)")
