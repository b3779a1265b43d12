"""Figure builders on synthetic trace events: escaping, state colours, cursors, per-mode panels, comparisons."""
from __future__ import annotations

import json
import re
from typing import Any

import pytest
from support.events import piece, rnd, run_events

from specscope.app.figures import (
    METRIC_COLUMNS,
    PERCENT,
    Claim,
    acceptance_position_figure,
    accepted_length_figure,
    case_figure,
    comparison_figure,
    comparison_rows,
    fmt,
    kv_figure,
    legend_html,
    live_round,
    metrics_rows,
    metrics_table_html,
    mode_color,
    run_labels,
    run_stats_html,
    show_piece,
    sparkline,
    speedup_html,
    token_diff_html,
)
from specscope.app.modebook import ModeBook
from specscope.app.palette import KV_REASONS, STATES, kv_color, palette_css, vocabulary
from specscope.app.specmetrics import fold_ratios, spec_metrics, step_map
from specscope.app.sweep import parse_variants
from specscope.app.trace import RunTrace, make_piece
from specscope.app.vizdoc import document_json, viz_document
from specscope.backend.engine.modes import describe_modes
from specscope.backend.tracing import STATES as TRACE_STATES

BOOK = ModeBook.of(describe_modes())
"""The registry's modes as the UI gets them (GET /api/modes)."""


@pytest.fixture
def trace() -> RunTrace:
    return RunTrace.from_events(run_events())


def test_live_round_sends_the_round_as_data(trace: RunTrace) -> None:
    """The chat's latest round reaches the browser as data (app/static/viz.js draws it): the round itself, its
    context cells, and the piece of every token it names, markup and all, never as HTML."""
    live = json.loads(live_round(trace.rounds[1], piece, trace.context(1)))
    assert live["round"] == {**trace.rounds[1], "accepted": 1} and live["hidden"] == 0 and live["missing"] == 0
    assert live["context"] == [list(c) for c in trace.context(1)]
    assert live["pieces"] == {"1": "Hi", "2": "<script>", "3": " there", "4": "\n", "9": "[M]"}
    assert live["shown"]["3"] == "␣there" and live["shown"]["4"] == "⏎" and live["vocab"] == vocabulary()
    guessed = rnd(1, 0, [1, 9], ["committed", "mask"], [], extra={"guess": [5]})
    assert json.loads(live_round(guessed, piece))["pieces"]["5"] == "&amp;"


def test_live_round_counts_positions_a_skipped_round_left_out(trace: RunTrace) -> None:
    """A live stream that skipped round 1 (a slow client's dropped rounds) still shows round 2's block at its
    position, with the position it lacks counted, not hidden."""
    assert json.loads(live_round(trace.rounds[2], piece, trace.context(2)))["missing"] == 0
    skipped = RunTrace.from_events([e for e in run_events() if e.get("round") != 1])
    assert [cell[0] for cell in skipped.context(1)] == [0, 1, 2] and skipped.rounds[1]["block_start"] == 4
    assert json.loads(live_round(skipped.rounds[1], piece, skipped.context(1)))["missing"] == 1


def test_live_round_cuts_long_context() -> None:
    context = [(i, 1, "prompt") for i in range(100)]
    live = json.loads(live_round(rnd(0, 100, [1], ["accepted"], [1]), piece, context, max_context=10))
    assert live["hidden"] == 90 and [c[0] for c in live["context"]] == list(range(90, 100))


def test_every_state_has_a_colour() -> None:
    for state in STATES:
        assert f".ss-s-{state}{{" in palette_css()
    assert ".ss-s-prompt, .ss-s-committed { opacity" in open("specscope/app/static/specscope.css").read()


def test_the_visualizer_reads_its_vocabulary_from_python() -> None:
    """States, colours, the masked states and the context limit reach app/static/viz.js in its documents only:
    none of them is written in the script, nor is the whitespace display."""
    vocab = vocabulary()
    assert list(vocab["states"]) == list(TRACE_STATES) and vocab["masked"] == ["mask", "padding"]
    assert set(vocab["counts"]) == {"accepted", "committed"} and vocab["context_cells"] > 0
    script = open("specscope/app/static/viz.js").read()
    assert not all(f'"{state}"' in script for state in TRACE_STATES), "the state vocabulary is written in viz.js"
    for word in ("48", "␣", "⏎", "--ss-"):
        assert word not in script, word


def test_show_piece_makes_whitespace_visible() -> None:
    assert show_piece(" a\n") == "␣a⏎"
    assert show_piece("") == "∅"
    assert show_piece("x" * 30).endswith("…")


def test_context_is_prompt_then_committed(trace: RunTrace) -> None:
    assert trace.context(0) == [(0, 1, "prompt"), (1, 2, "prompt")]
    assert trace.context(2) == [(0, 1, "prompt"), (1, 2, "prompt"), (2, 3, "committed"), (3, 2, "committed")]


def cursor(fig) -> list:
    return [s for s in fig.layout.shapes if s.name == "cursor"]


def test_accepted_length_has_cursor_and_integer_axes(trace: RunTrace) -> None:
    fig = accepted_length_figure(trace.rounds)
    assert list(fig.data[0].y) == [1, 1, 1] and list(fig.data[1].y) == [1, 2, 2]   # accepted, then committed
    assert cursor(fig) and cursor(fig)[0].x0 == 0, "a cursor the browser moves to the current round"
    assert fig.layout.xaxis.tickformat == "d" and fig.layout.xaxis.dtick == 1  # no 0.5 ticks
    assert fig.layout.yaxis.title.text == "accepted"
    # A block mode's commits (a whole block at once) have their own axis, so they do not flatten the
    # accepted bars; the step line's levels are centred on their bars; the legend sits under the plot, clear of
    # the title.
    committed = fig.data[1]
    assert committed.yaxis == "y2" and fig.layout.yaxis2.overlaying == "y" and committed.line.shape == "hvh"
    assert fig.layout.legend.y < 0 and fig.layout.legend.yanchor == "top"


def test_kv_figure_bars_with_base_coloured_by_reason() -> None:
    intervals = [{"slot": 0, "position": 0, "alloc_round": 0, "free_round": 3, "end_reason": "finished"},
                 {"slot": 1, "position": 5, "alloc_round": 1, "free_round": 1, "end_reason": "rejected"},
                 {"slot": 2, "position": 6, "alloc_round": 2, "free_round": None, "end_reason": None}]
    fig = kv_figure(intervals, n_rounds=4)
    assert fig.layout.xaxis.type != "date"
    by_name = {t.name: t for t in fig.data}
    assert set(by_name) == {"finished", "rejected", "held"}
    assert by_name["finished"].orientation == "h" and list(by_name["finished"].base) == [0]
    assert list(by_name["finished"].x) == [3]
    assert by_name["rejected"].x[0] > 0, "a slot freed in its own round still shows"
    assert list(by_name["held"].x) == [2], "a leaked slot runs to the end"
    assert by_name["rejected"].marker.color == kv_color("rejected") == KV_REASONS["rejected"][0]
    assert list(fig.layout.xaxis.range) == [-0.5, 3.5], "rounds 0..3, not one more"
    assert fig.layout.yaxis.title.text and cursor(fig)


def test_case_figure_and_acceptance_by_position() -> None:
    rounds = [rnd(0, 0, [1, 9, 9], ["bonus", "draft", "padding"], [1], case="C"),
              rnd(1, 1, [1, 2, 3], ["pending", "accepted", "bonus"], [2, 3], case="V"),
              rnd(2, 3, [3, 4, 5], ["pending", "rejected", "bonus"], [5], case="R")]
    by_name = {t.name: t for t in case_figure(rounds).data}
    assert list(by_name["V"].x) == [1] and list(by_name["R"].x) == [2] and list(by_name["C"].x) == [0]
    fig = acceptance_position_figure([0.5, 0.25])
    assert list(fig.data[0].x) == [1, 2] and list(fig.data[0].text) == ["50%", "25%"]


def linear_round(r: int, states: list[str], replaced: int | None = None) -> dict[str, Any]:
    extra = {"replaced_draft": replaced} if replaced is not None else {}
    tokens = list(range(len(states)))
    committed = [t for t, s in zip(tokens, states, strict=True) if s in ("accepted", "bonus")]
    event = rnd(r, 10 + r, tokens, states, committed, extra=extra)
    event["phases"] = [{"kind": "draft"}, {"kind": "verify"}]
    return event


def test_spec_metrics_follow_vllm_definitions() -> None:
    """mean_acceptance_length = 1 + accepted / verify steps; per-position rate = share of steps accepting draft i."""
    events = run_events()
    events[1:4] = [rnd(0, 2, [3], ["accepted"], [3], nfe=0),
                   linear_round(1, ["committed", "accepted", "accepted", "bonus", "rejected"], replaced=7),
                   linear_round(2, ["committed", "accepted", "accepted", "accepted", "bonus"])]
    m = spec_metrics(RunTrace.from_events(events))
    assert m["num_spec_steps"] == 2 and m["per_step_drafted"] == [4, 3] and m["per_step_accepted"] == [2, 3]
    assert m["mean_acceptance_length"] == 1 + 5 / 2 and m["draft_acceptance_rate"] == 5 / 7
    assert m["acceptance_rate_per_position"] == [1.0, 1.0, 0.5, 0.0]
    assert spec_metrics(RunTrace("r_ar", mode="ar")) is None


def test_spec_metrics_of_isd_and_branching_modes() -> None:
    isd = run_events(mode="isd")
    isd[2]["pq"] = [{"i": 0, "p": 0.9, "q": 0.5, "accepted": True}, {"i": 1, "p": 0.1, "q": 0.5, "accepted": False}]
    m = spec_metrics(RunTrace.from_events(isd))
    assert m["per_step_accepted"] == [1] and m["per_step_drafted"] == [2]
    branch = {"id": 0, "tokens": [1]}
    spiffy = run_events(mode="spiffy")
    verify = {"phases": [{"kind": "verify"}], "branches": [branch, {"id": 1}, {"id": 2}]}
    hit = {"phases": [], "branches": [{"id": 1, "cache_hit": True, "verified_round": 1}]}
    spiffy[2].update(verify)
    spiffy[3].update(hit)
    m = spec_metrics(RunTrace.from_events(spiffy))
    assert m["per_step_drafted"] == [2] and m["per_step_accepted"] == [1] and m["mean_acceptance_length"] == 2


def test_fold_ratios_and_step_map(trace: RunTrace) -> None:
    r = rnd(5, 0, [1, 2], ["mask", "mask"], [], branches=[{"id": 0, "tokens": [1, 2]}, {"id": 1, "tokens": [1, 2]}],
            fold=[[2, 1], [2, 0]], extra={"fold_ffn": [[2, 2], [2, 2]]})
    assert fold_ratios(r) == (0.75, 0.0)
    assert fold_ratios(rnd(0, 0, [1], ["accepted"], [1])) == (None, None)
    assert step_map(trace) == [0, 1, 1, 2, 2]  # the round that revealed each output token


def test_viz_document_carries_what_the_browser_draws(trace: RunTrace) -> None:
    doc = viz_document(trace, piece, book=BOOK)
    assert doc["run_id"] == "r_test" and len(doc["rounds"]) == 3 and "run_id" not in doc["rounds"][0]
    assert (doc["model"], doc["matmul"]) == ("m", "bf16")
    assert doc["pieces"]["2"] == "<script>" and doc["step_map"] == [0, 1, 1, 2, 2]
    drawn = {"accepted", "kv", "positions", "timeline"} | ({"kv_time"} if trace.kv else set())
    assert set(doc["figures"]) == drawn and doc["spec"]["num_spec_steps"] == 2
    assert "accepted" in doc["explain"].lower() and doc["explain"] == BOOK.explain(trace.mode)
    assert doc["color"] == BOOK.color(trace.mode) and not doc["pq"]   # no p/q tables nor round cases here
    assert json.loads(document_json(doc))["mode"] == "linear_spec" and document_json(None) == ""
    assert doc["fit"] is None
    picks = [*trace.output_ids[:-1], 77]
    fit = {"run_id": "r_test", "picks": picks, "nll": [0.5] * len(picks), "greedy": len(picks) - 1,
           "tokens": len(picks), "greedy_share": 0.8, "nll_mean": 0.5, "model": "m"}
    rated = viz_document(trace, piece, fit=fit)
    assert rated["fit"] == {k: fit[k] for k in ("picks", "nll", "greedy", "tokens", "nll_mean")}
    assert rated["pieces"]["77"] == piece(77)   # the pick the run did not take is drawn too


def test_parse_variants_expands_sweeps() -> None:
    specs = [{"name": "isd", "params": [{"name": "n", "type": "int"}, {"name": "alpha", "type": "float"}]},
             {"name": "ar", "params": []}]
    assert parse_variants("isd n=2,4 alpha=1.0\n\n# note\nar", specs) == [
        ("isd", {"n": 2, "alpha": 1.0}), ("isd", {"n": 4, "alpha": 1.0}), ("ar", {})]
    for bad, word in (("nope n=1", "unknown mode"), ("isd x=1", "'x=1'"), ("isd n=two", "'n=two'")):
        with pytest.raises(ValueError, match=word):
            parse_variants(bad, specs)


def test_comparison_lines_stable_colours_dashes_and_table_counts() -> None:
    a = RunTrace.from_events(run_events("r_a", "ar"))
    b = RunTrace.from_events(run_events("r_b", "linear_spec"))
    c = RunTrace.from_events(run_events("r_c", "linear_spec"))
    c.params = {"max_new_tokens": 5, "threshold": 0.5}
    fig = comparison_figure([a, b, c], BOOK)
    assert len(fig.data) == 3
    assert list(fig.data[0].x) == [0, 0, 2, 4] and list(fig.data[0].y) == [0, 1, 3, 5]
    assert fig.data[1].line.color == fig.data[2].line.color == mode_color("linear_spec", BOOK) != mode_color("ar", BOOK)
    assert fig.data[0].line.color == BOOK.specs["ar"]["color"]   # the colour the mode declares
    assert fig.data[1].line.dash != fig.data[2].line.dash, "identical lines stay distinguishable"
    a.end["metrics"]["tokens"] = 4  # EOS committed but not counted by the table: the chart agrees
    assert comparison_figure([a]).data[0].y[-1] == 4
    assert run_labels([a, b, c]) == ["ar", "linear_spec", "linear_spec threshold=0.5"]


def test_metrics_table_badges_and_escaping() -> None:
    ref = RunTrace.from_events(run_events("r_ref", "ar"))
    same = RunTrace.from_events(run_events("r_same", "linear_spec"))
    other = RunTrace.from_events(run_events("r_other", "<i>mode</i>", output=[3, 2]))
    table = metrics_table_html([ref, same, other], ref)
    assert table.count("<tr>") == 4 and '<div class="ss-scroll">' in table and 'href="?run=r_ref&amp;round=0"' in table
    assert metrics_rows([ref])[0][:5] == ["run", "mode", "label", "status", "tokens"]
    assert "reference" in table and "same output as reference" in table and "differs from reference" in table
    assert "&lt;i&gt;mode&lt;/i&gt;" in table and "<i>mode" not in table
    assert ">1.25<" in table and ">50.0<" in table
    claims = ModeBook.of([{"name": "linear_spec", "lossless_vs": "ar"}, {"name": "<i>mode</i>", "lossless_vs": "ar"},
                          {"name": "spiffy", "lossless_vs": "block_diffusion"}])
    table = metrics_table_html([ref, same, other], ref, claims)
    assert "== ar" in table and "≠ ar (first 2 of 5 tokens as ar)" in table
    spiffy = RunTrace.from_events(run_events("r_s", "spiffy"))
    assert "add a greedy block_diffusion run of this prompt to check" in metrics_table_html([spiffy], None, claims)
    fits = {"r_ref": {"tokens": 5, "greedy": 5, "nll_mean": 0.4321}, "r_other": "another model's run <b>"}
    table = metrics_table_html([ref, same, other], ref, claims, fits)
    assert ">model&#x27;s pick</th>" in table
    assert "5 of 5 tokens are the model&#x27;s own pick; mean NLL 0.43 nats" in table
    assert "<small>another model&#x27;s run &lt;b&gt;</small>" in table and table.count("<td></td>") >= 1


def test_a_lossless_verdict_only_where_the_claim_holds() -> None:
    """A failed run gets its error and no verdict; T>0 or parameters outside the claim read "not
    claimed" with the measured agreement; the reference must be a greedy run of the same prompt and length."""
    claims = ModeBook.of([{"name": "specfold", "lossless_vs": "spiffy",
                           "lossless_params": {"delta": 0.0, "ffn_gate": "strict"}},
                          {"name": "isd", "lossless_vs": "ar", "lossless_params": {}}, {"name": "ar"}])
    assert claims.claims == {"specfold": Claim("spiffy", {"delta": 0.0, "ffn_gate": "strict"}),
                             "isd": Claim("ar", {})}
    ar = RunTrace.from_events(run_events("r_ar", "ar"))
    hot = RunTrace.from_events(run_events("r_hot", "isd", output=[3, 2, 9]))
    hot.params = {"max_new_tokens": 5, "temperature": 0.8}
    assert "not claimed (T=0.8) · first 2 of 5 tokens as ar" in metrics_table_html([ar, hot], ar, claims)
    spiffy = RunTrace.from_events(run_events("r_sp", "spiffy"))
    fold = RunTrace.from_events(run_events("r_f", "specfold"))
    fold.params = {"max_new_tokens": 5, "delta": 0.1, "ffn_gate": "paper"}
    assert "not claimed (delta=0.1, ffn_gate=paper)" in metrics_table_html([spiffy, fold], spiffy, claims)
    fold.params = {"max_new_tokens": 5, "delta": 0.0, "ffn_gate": "strict"}
    assert "== spiffy" in metrics_table_html([spiffy, fold], spiffy, claims)
    longer = RunTrace.from_events(run_events("r_ar8", "ar"))
    longer.params = {"max_new_tokens": 8}
    greedy = RunTrace.from_events(run_events("r_isd", "isd"))
    assert "add a greedy ar run" in metrics_table_html([longer, greedy], longer, claims)
    failed = RunTrace.from_events([{"type": "error", "code": "bad_params", "message": "delta must be <= 1"}])
    failed.mode = "specfold"
    table = metrics_table_html([spiffy, failed], spiffy, claims)
    assert "same output" not in table and "== spiffy" not in table
    assert "no verdict" in table and "delta must be &lt;= 1" in table and "(not started)" in table
    assert 'href="?run=&amp;' not in table   # no link to a run that never started


def test_token_diff_marks_insertions_and_deletions() -> None:
    diff = token_diff_html([1, 2, 3], [1, 3, 5], piece)
    assert 'ss-eq' in diff and 'ss-del' in diff and 'ss-ins' in diff
    assert "&lt;script&gt;" in diff and "<script>" not in diff
    assert token_diff_html([], [], piece).endswith("<i>empty</i></div>")


def test_legend_explains_every_colour() -> None:
    legend = legend_html()
    for state in STATES:
        assert f"<b>{state}</b>" in legend
    assert 'data-count="accepted"' in legend and 'data-count="committed"' in legend
    for reason in KV_REASONS:
        assert f"<b>{reason or 'held'}</b>" in legend
    for case in "VRC":
        assert f"<b>{case}</b>" in legend


def test_stats_line_and_sparkline(trace: RunTrace) -> None:
    assert sparkline([0, 2, 4]) == "▁▅█" and sparkline([]) == "" and sparkline([1, 1]) == "▄▄"
    long = sparkline([1] * 300 + [8] * 300)   # a 600-round run: one line of 48 bars, the halves kept
    assert len(long) == 48 and set(long[:24]) == {"▂"} and set(long[24:]) == {"█"}
    line = run_stats_html(trace)
    assert "stopped at 5 tokens (max_new_tokens)" in line and "<b>linear_spec</b>" in line   # cut, not ended by EOS
    short = RunTrace.from_events(run_events(output=[3, 2]))
    short.end = {**short.end, "metrics": {**short.end["metrics"], "tokens": 2}}
    assert "stopped" not in run_stats_html(short)
    assert "TPF 1.25" in line and "NFE 4" in line and "50.0 tok/s" in line and "r_test" in line
    assert f'model <b class="ss-model">{trace.model or "?"}</b>' in line   # every answer names its model
    for reason, note in (("client", "</svg> stopped"), ("model_switch", "switched models"), (None, "</svg> stopped")):
        ended = RunTrace.from_events([{**trace.end, "type": "run_start", "mode": "ar"},
                                      {**trace.end, "status": "cancelled", "reason": reason}])
        assert note in run_stats_html(ended) and ("switched" in run_stats_html(ended)) == (reason == "model_switch")


def test_figures_serialise_without_nan(trace: RunTrace) -> None:
    for fig in (accepted_length_figure(trace.rounds), comparison_figure([trace])):
        json.loads(fig.to_json())


def test_piece_fallbacks() -> None:
    assert make_piece(["a", "b"], {1: "x"})(1) == "x", "a run's own pieces win over the backend's vocab"
    assert make_piece(["a", "b"], {1: "x"})(0) == "a"
    assert make_piece(None, {1: "x"})(1) == "x"
    assert make_piece(None)(7) == "#7"


def test_bench_tab_tables_and_speedup_figure() -> None:
    from specscope.app.tabs.bench import kernel_rows, mode_rows, speedup_figure, summary_html
    modes = {"meta": {"prompts": 3}, "modes": {"isd": {"nfe": 10, "tpf": 1.5, "tok_per_s": 99.0, "speedup_vs_ar": 0.7,
                                                       "accept_len_mean": 1.6, "accuracy": {"average": 0.5},
                                                       "same_as_reference": 1.0, "reference": "ar",
                                                       "fold_ratio": None}}}
    assert mode_rows(modes) == [["isd", 10, "1.50", "99", "0.70", "1.60", "0.50", "100 % vs ar", "—"]]
    assert mode_rows(modes, BOOK) == [[*mode_rows(modes)[0], *["—"] * len(BOOK.all_columns())]]
    lossy = {"modes": {"block_diffusion": {**modes["modes"]["isd"], "same_as_reference": 0.0, "agreed_prefix": 0.25,
                                           "greedy_share": 0.714, "answer_nll": 1.236}}}
    assert mode_rows(lossy)[0][7:9] == ["0 % vs ar, first 25 % agree", "71 % (1.24)"]
    row = {"branches": 4, "prefix": 1024, "target_fold": 0.3, "fold_qkv": 0.31, "fold_ffn": 0.2, "dense_ms": 2.0,
           "folded_ms": 1.0, "speedup": 2.0, "dense_tflops": 1.0, "folded_tflops": 1.0, "dense_gbps": 5.0,
           "folded_gbps": 5.0}
    kernels = {"device": "H200", "backend": "triton", "ceilings": {}, "rows": [row, {**row, "fold_qkv": 0.0}]}
    assert kernel_rows(kernels)[0][:3] == [4, 1024, "0.30"]
    fig = speedup_figure(kernels)
    assert list(fig.data[0].x) == [0.0, 0.31] and fig.data[0].name == "B=4, prefix 1024"
    assert "H200" in fig.layout.title.text
    assert "No kernel benchmark" in summary_html({"modes": modes, "kernels": None, "problems": []})
    assert "&lt;b&gt;" in summary_html({"modes": None, "kernels": {**kernels, "device": "<b>"}, "problems": []})
    assert speedup_figure(None).data == ()


def test_markdown_answers_escape_html_and_render_code() -> None:
    from specscope.app.figures import markdown_html
    shown = markdown_html('Use **this**: <img src=x onerror="alert(1)"><script>x()</script>\n\n'
                          '```python\nif a < b:\n    print("<b>")\n```\n\n[go](javascript:alert(1)) and [ok](https://a.b)')
    assert "<strong>this</strong>" in shown
    assert "<img" not in shown and "<script" not in shown and "&lt;img src=x" in shown   # shown as written
    assert '<pre><code class="language-python">if a &lt; b:\n    print(&quot;&lt;b&gt;&quot;)\n</code></pre>' in shown
    assert 'href="javascript' not in shown and '<a href="https://a.b">ok</a>' in shown


def test_the_comparison_csv_carries_both_verdicts_the_prompt_and_the_output() -> None:
    """The CSV holds what the table shows (the verdicts as their text), plus what a reader needs to check them."""
    ref = RunTrace.from_events(run_events("r_ref", "ar"))
    same = RunTrace.from_events(run_events("r_same", "linear_spec"))
    other = RunTrace.from_events(run_events("r_other", "linear_spec", output=[3, 2]))
    head, *rows = comparison_rows([ref, same, other], ref, ModeBook.of([{"name": "linear_spec", "lossless_vs": "ar"}]))
    assert head[-4:] == ["output vs reference", "lossless claim", "prompt", "output"]
    verdicts = [row[-4:-2] for row in rows]
    assert verdicts == [["reference", ""], ["same output as reference", "== ar"],
                        ["differs from reference", verdicts[2][1]]] and verdicts[2][1].startswith("≠ ar")
    assert all(row[-2] == ref.prompt and row[-1] == run.text for row, run in zip(rows, [ref, same, other],
                                                                                   strict=True))


def test_a_share_reads_as_a_percentage_wherever_it_is_shown() -> None:
    assert fmt(0.825, PERCENT) == "82.5%" and fmt(None, PERCENT) == "—"
    assert dict((key, spec) for key, _, spec in METRIC_COLUMNS)["draft_acceptance_rate"] == PERCENT


def test_a_live_runs_document_carries_its_running_figures(trace) -> None:
    """While a run streams (no run_end yet), the Visualizer's summary counts tokens, NFE, TPF and tok/s from the
    rounds so far instead of showing dashes."""
    live = RunTrace.from_events([dict(e, t_ms=200.0 * i) for i, e in enumerate(run_events()[:-1])])
    figures = viz_document(live, piece)["metrics"]
    assert figures["tokens"] == 5 and figures["nfe"] == 4 and figures["tpf"] == 1.25
    assert figures["tok_per_s"] == pytest.approx(5 / 0.6)
    assert viz_document(trace, piece)["metrics"]["tok_per_s"] == 50.0    # an ended run: its own metrics


def tiered(run_id: str, mode: str, rows: int) -> RunTrace:
    """A run whose rounds after the prefill ran under a tier of `rows` extra rows, of its own 6, with 2 running."""
    events = run_events(run_id, mode)
    for e in events:
        if e["type"] == "round" and e["round"] > 0:
            e["extra"] = {**(e.get("extra") or {}), "tier": {"running": 2, "block_size": None, "extra_rows": rows,
                                                            "own_rows": 6}}
    return RunTrace.from_events(events)


def test_every_view_of_a_run_says_how_many_rounds_a_tier_cut_and_why() -> None:
    cut, full = tiered("r_cut", "isd", 0), tiered("r_full", "isd", 6)
    note = "load tier reduced drafting in 2 rounds: drafting off with 2 runs active (2)"
    assert cut.tier_note == note and full.tier_note == ""
    assert note in run_stats_html(cut) and "load tier" not in run_stats_html(full)
    table = metrics_table_html([full, cut])
    assert table.count("load tier") == 1 and note in table
    assert viz_document(cut, make_piece(None))["tier_note"] == note


def test_the_speedup_factors_shown_multiply_to_the_product_shown() -> None:
    base = RunTrace.from_events(run_events("r_ar", "ar"))
    run = RunTrace.from_events(run_events("r_fast", "isd"))
    base.end = {**base.end, "metrics": {"nfe": 10, "tpf": 1.0, "mean_forward_ms": 1.0, "forward_share": 0.5,
                                        "tok_per_s": 100.0}}
    run.end = {**run.end, "metrics": {"nfe": 7, "tpf": 1.4449, "mean_forward_ms": 1.0 / 0.8449,
                                      "forward_share": 0.5 * 1.0049, "tok_per_s": 122.68}}
    cells = re.findall(r'<td class="ss-num">(?:<b>)?([\d.]+)', speedup_html([base, run], BOOK))
    assert "needs a finished <code>ar</code> run" in speedup_html([run], BOOK)   # the baseline, by its name
    tpf, row_cost, share, product, _ = (float(c) for c in cells)
    assert abs(tpf * row_cost * share - product) <= 0.0005, cells
    assert len(cells[0].split(".")[1]) >= 3   # enough digits that a factor's rounding barely moves the product
