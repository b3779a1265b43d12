"""The app's pure views of runs: the divergence report as HTML, the acceptance alarm badge, acceptance by draft
position from the stored vLLM counts, the load warning of a comparison, counts said in words, the KV banner."""
from __future__ import annotations

import json
import re
from typing import Any

from support.events import piece, run_events

from specscope.app.diverge import differing_pairs, diverge_html
from specscope.app.figures import (
    acceptance_by_position_figure,
    acceptance_rates,
    alarm_html,
    load_warning_html,
    metrics_table_html,
    one_row_ms,
    pick_cell,
    plural,
    run_labels,
    run_stats_html,
)
from specscope.app.live import figures_html
from specscope.app.tabs.compare import ended, progress_html
from specscope.app.tabs.runs import COLUMNS, table_rows
from specscope.app.tabs.scheduler import forwards_table_html
from specscope.app.trace import RunTrace
from specscope.app.ui import status_html

LOOP = {"flag": "loop", "why": "the last 24 of 30 tokens repeat a 3-token cycle 8 times"}


def made(run_id: str, mode: str = "linear_spec", output: list[int] | None = None, ms: float = 1.0,
         metrics: dict[str, Any] | None = None, curve: dict[str, Any] | None = None) -> RunTrace:
    """A synthetic run whose forwards each took `ms`, with extra run_end metrics."""
    events = run_events(run_id, mode, output)
    events[0] = {**events[0], "cost_curve": curve}
    for e in events[1:-1]:
        e["phases"] = [{**p, "ms": ms} for p in e["phases"]]
    events[-1] = {**events[-1], "metrics": {**events[-1]["metrics"], **(metrics or {})}}
    return RunTrace.from_events(events)


REPORT = {
    "position": 2, "prompt_tokens": 2, "cause": "the matmul difference (bf16 vs float32) alone moves the argmax; "
                                               "a near-tie: a's margin 0.01 is below what bf16 resolves here (0.05)",
    "near_tie": True, "lossless_claim": {"mode": "linear_spec", "reference": "ar", "checked": True, "blockers": [],
                                         "holds": False, "broken": True, "agreement": "first 2 of 5 tokens agree"},
    "a": {"run_id": "r_a", "mode": "linear_spec", "matmul": "bf16", "adapter": False, "temperature": 0.0, "token": 2,
          "path": "a verify row", "top": [{"id": 2, "logit": 7.51}, {"id": 3, "logit": 7.5}], "margin": 0.01,
          "argmax": 2, "reproduced": True, "resolution": 0.05, "resolution_note": "2 x max |logit difference|",
          "near_tie": True, "not_rescored": None},
    "b": {"run_id": "r_b", "mode": "ar", "matmul": "float32", "adapter": False, "temperature": 0.0, "token": 3,
          "path": "a decode row", "top": [{"id": 3, "logit": 7.6}, {"id": 2, "logit": 7.2}], "margin": 0.4,
          "argmax": 3, "reproduced": True, "resolution": 0.001, "resolution_note": "", "near_tie": False,
          "not_rescored": None},
    "attribution": [{"factor": "matmul", "a": "bf16", "b": "float32", "probe": "a's row with b's matmul",
                     "argmax": 3, "moves": True, "to_other": True, "not_rescored": None}],
}


def test_the_divergence_report_shows_the_position_both_top_k_the_cause_the_tie_and_the_attribution() -> None:
    shown = diverge_html(REPORT, piece)
    assert "first part at output token 2 (after 2 shared tokens; position 4 counting the prompt's 2 tokens)" in shown
    assert "the matmul difference (bf16 vs float32) alone moves the argmax" in shown and "near-tie" in shown
    for side in ("div-a", "div-b"):
        assert f'id="{side}"' in shown
    assert "7.510" in shown and "7.600" in shown and "0.400" in shown   # logits and the margin
    assert "&lt;script&gt;" in shown and "<script>" not in shown         # token pieces escaped
    assert 'id="div-attribution"' in shown and "moves it to the other" in shown
    assert "broken" in shown and "first 2 of 5 tokens agree" in shown
    same = diverge_html({**REPORT, "position": None, "cause": "identical: all 5 tokens are the same",
                         "attribution": [], "near_tie": False, "lossless_claim": None})
    assert "never part" in same and 'id="div-a"' not in same


def test_only_pairs_whose_outputs_differ_are_offered_the_reference_first() -> None:
    ar, same, other = made("r_1", "ar"), made("r_2"), made("r_3", output=[3, 2, 5, 5, 1])
    runs = [ar, same, other]
    assert differing_pairs(runs, ar, run_labels(runs)) == [("ar vs linear_spec (r_3)", "r_1 r_3")]
    assert differing_pairs(runs, None, run_labels(runs)) == []


def test_the_alarm_shows_its_flag_with_why_as_the_hover_in_chat_stats_compare_rows_and_the_runs_table() -> None:
    flagged = made("r_1", metrics={"alarm": LOOP})
    badge = f'title="{LOOP["why"]}">⚠ loop</span>'
    assert alarm_html(flagged.metrics).endswith(badge) and alarm_html({"alarm": {"flag": None}}) == ""
    assert badge in run_stats_html(flagged) and badge in metrics_table_html([flagged])
    assert "⚠" not in run_stats_html(made("r_2"))
    row = table_rows([{"run_id": "r_1", "created_at": "2026-01-01T00:00:00", "mode": "isd", "params": {},
                       "status": "done", "n_tokens": 3, "n_rounds": 2, "prompt": "p", "metrics": flagged.metrics}])[0]
    assert badge in row[COLUMNS.index("alarm")]


def test_acceptance_by_position_is_accepted_per_position_over_drafts_per_drafting_run() -> None:
    counts = {"num_drafts": 4, "num_draft_tokens": 12, "num_accepted_tokens": 5,
              "num_accepted_tokens_per_pos": [3, 2, 0]}
    assert acceptance_rates(counts) == [0.75, 0.5, 0.0] and acceptance_rates({"num_drafts": 0}) == []
    runs = [made("r_1", "ar"), made("r_2", metrics=counts), made("r_3", metrics={**counts, "num_drafts": 3})]
    fig = json.loads(acceptance_by_position_figure(runs).to_json())
    assert [t["y"] for t in fig["data"]] == [[0.75, 0.5, 0.0], [1.0, 2 / 3, 0.0]]   # ar drafted nothing: no bars
    assert fig["data"][0]["x"] == [1, 2, 3] and fig["layout"]["yaxis"]["tickformat"] == ".0%"
    assert "no run drafted" in json.loads(acceptance_by_position_figure(runs[:1]).to_json())["layout"]["title"]["text"]


def test_a_comparison_warns_which_runs_were_measured_under_other_load_and_by_how_much() -> None:
    ref, calm, loaded = made("r_ref", "ar", ms=2.0), made("r_calm", ms=2.2), made("r_busy", "isd", ms=6.0)
    assert one_row_ms(ref) == 2.0
    warning = load_warning_html([ref, calm, loaded], ref)
    assert "measured under different load" in warning and "r_busy" in warning and "3.0× slower" in warning
    assert "r_calm" not in warning and "2.00 ms" in warning
    assert load_warning_html([ref, calm], ref) == ""
    # with a cost curve, each forward is scaled from the rows it computed for the run to one row: 4 rows at 6 ms on
    # a curve where 4 rows cost 3x one row is a 2 ms 1-row forward, the reference's load
    wide = made("r_wide", ms=6.0, curve={"ms": {"1": 1.0, "2": 2.0, "4": 3.0}})
    for r in wide.rounds:
        r["phases"] = [{**p, "n_query": 4} for p in r["phases"]]
    assert abs(one_row_ms(wide) - 2.0) < 1e-9 and "r_wide" not in load_warning_html([ref, wide], ref)


def test_counts_are_said_with_their_singular_and_ratings_in_words() -> None:
    assert plural(1, "token") == "1 token" and plural(2, "token") == "2 tokens" and plural(0, "run") == "0 runs"
    assert figures_html({"tokens": 1, "nfe": 1, "tpf": 1.0}).startswith("1 token ·")
    record = {"id": 1, "ms": 1.0, "rows": 1, "groups": [{"run_id": "r_1", "mode": "ar", "round": 1, "rows": 1,
                                                         "kind": "decode"}]}
    assert "(1 decode row)" in forwards_table_html([record])
    cut = made("r_1", metrics={"tokens": 1})
    cut.params["max_new_tokens"] = 1
    assert "stopped at 1 token (max_new_tokens)" in run_stats_html(cut)
    one = RunTrace(run_id="r_1", rounds=[{"round": 0}])
    assert "(1 round)" in progress_html([one])
    words = pick_cell({"greedy": 39, "tokens": 39, "nll_mean": 0.19})
    assert "39 of 39 tokens are the model&#x27;s own pick; mean NLL 0.19 nats" in words
    assert 'title="39/39 (0.19)"' in words


def test_the_banner_says_slots_held_with_no_run_active_are_held_outside_any_run() -> None:
    idle = status_html({"model": "m", "active_runs": 0, "pool": {"used": 12, "slots": 4096}})
    assert "KV slots held outside any run 12/4096" in idle and "KV slots in use" not in idle
    busy = status_html({"model": "m", "active_runs": 1, "pool": {"used": 12, "slots": 4096}})
    assert "KV slots in use 12/4096" in busy


def test_rows_appear_as_runs_end() -> None:
    done, running = made("r_1", "ar"), made("r_2")
    running.end = None
    waiting = RunTrace(run_id="")
    assert ended([done, running, waiting]) == [done]
    assert re.search(r"running \(3 rounds\)", progress_html([done, running, waiting]))
