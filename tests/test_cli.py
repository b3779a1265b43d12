"""The specscope CLI through main([...]) on a tmp SQLite store, plus the installed console script once."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specscope.backend.cli import main
from specscope.backend.store import Store

PROMPT = "What is 12 + 30?"


@pytest.fixture
def db(tmp_path: Path, monkeypatch, loaded) -> str:
    """A store URL in tmp_path; the CLI gets the already loaded model instead of reading it again."""
    monkeypatch.setattr("specscope.backend.cli.options.load_checkpoint", lambda *args, **kwargs: loaded)
    return f"sqlite:///{tmp_path / 'cli.db'}"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def generate(capsys, db: str, mode: str = "linear_spec", *extra: str) -> tuple[str, str]:
    """`specscope run`; returns (run id, stdout)."""
    code, out, _ = run_cli(capsys, "run", PROMPT, "--mode", mode, "--max-new-tokens", "12", "--slots", "2048",
                           "--cost-curve", "flat", "--db", db, *extra)
    assert code == 0
    found = re.search(r"^run (r_\w+)", out, re.MULTILINE)
    assert found, out
    return found.group(1), out


def test_run_streams_text_prints_metrics_and_stores_the_run(capsys, db):
    run_id, out = generate(capsys, db, "linear_spec", "--param", "block_size=4", "--param", "lora=false")
    assert "NFE" in out and "TPF" in out and "KV peak" in out
    with Store(db) as store:
        run = store.get_run(run_id)
    assert run["status"] == "done" and run["params"]["block_size"] == 4 and run["params"]["lora"] is False
    assert out.startswith(run["output"])


def test_run_no_store_and_bad_input(capsys, db):
    run_id, out = generate(capsys, db, "ar", "--no-store")
    assert "not stored" in out
    with Store(db) as store:
        assert store.get_run(run_id) is None
    code, _, err = run_cli(capsys, "run", PROMPT, "--mode", "warp_drive", "--db", db)
    assert code == 2 and "warp_drive" in err
    code, _, err = run_cli(capsys, "run", PROMPT, "--mode", "ar", "--param", "block_size", "--db", db)
    assert code == 2 and "key=value" in err
    code, _, err = run_cli(capsys, "run", PROMPT, "--mode", "ar", "--param", "temperature=-2", "--db", db)
    assert code == 2 and "temperature" in err


def test_run_takes_a_conversation(capsys, db, tmp_path, loaded):
    """--messages (inline JSON, a file) and --system become the chat-templated prompt; the stored run_start holds
    the conversation; bad conversations are refused with a clear message."""
    from specscope.backend.engine.engine import Engine
    conv = [{"role": "user", "content": "Copy: a b"}, {"role": "assistant", "content": "a b"},
            {"role": "user", "content": PROMPT}]
    (tmp_path / "conv.json").write_text(json.dumps(conv))
    inline, _ = generate_conversation(capsys, db, "--messages", json.dumps(conv), "--system", "Be brief.")
    from_file, _ = generate_conversation(capsys, db, "--messages", str(tmp_path / "conv.json"), "--system",
                                         "Be brief.")
    with Store(db) as store:
        starts = [store.events(r)[0] for r in (inline, from_file)]
    want = [{"role": "system", "content": "Be brief."}, *conv]
    assert starts[0]["messages"] == starts[1]["messages"] == want and starts[0]["prompt"] == PROMPT
    assert starts[0]["prompt_ids"] == Engine(loaded, num_slots=256).encode_prompt(want, raw=False)
    for argv, says in ((["--messages", "[1, 2]"], "messages[0]"), (["--messages", "not json"], "not a JSON list"),
                       ([PROMPT, "--messages", json.dumps(conv)], "one of them"), ([], "one of them")):
        code, _, err = run_cli(capsys, "run", *argv, "--mode", "ar", "--db", db)
        assert code == 2 and says in err, err


def generate_conversation(capsys, db: str, *argv: str) -> tuple[str, str]:
    code, out, err = run_cli(capsys, "run", *argv, "--mode", "ar", "--max-new-tokens", "6", "--db", db)
    assert code == 0, err
    return re.search(r"^run (r_\w+)", out, re.MULTILINE).group(1), out


def test_runs_ls_show_rm(capsys, db):
    ls_id, _ = generate(capsys, db, "linear_spec")
    ar_id, _ = generate(capsys, db, "ar")
    _, out, _ = run_cli(capsys, "runs", "ls", "--db", db)
    assert out.index(ar_id) < out.index(ls_id)  # newest first
    _, out, _ = run_cli(capsys, "runs", "ls", "--mode", "ar", "--db", db)
    assert ar_id in out and ls_id not in out
    _, out, _ = run_cli(capsys, "runs", "ls", "--status", "cancelled", "--db", db)
    assert ar_id not in out and ls_id not in out
    code, out, _ = run_cli(capsys, "runs", "show", ar_id, "--db", db)
    assert code == 0 and json.loads(out)["run_id"] == ar_id
    assert run_cli(capsys, "runs", "rm", ar_id, "--db", db)[0] == 0
    code, _, err = run_cli(capsys, "runs", "rm", ar_id, "--db", db)
    assert code == 2 and ar_id in err
    assert run_cli(capsys, "runs", "show", ar_id, "--db", db)[0] == 2


def test_export_json_and_perfetto(capsys, db, tmp_path):
    run_id, _ = generate(capsys, db, "ar")
    doc_path, trace_path = tmp_path / "run.json", tmp_path / "run.perfetto.json"
    assert run_cli(capsys, "export", run_id, "--format", "json", "-o", str(doc_path), "--db", db)[0] == 0
    assert run_cli(capsys, "export", run_id, "--format", "perfetto", "-o", str(trace_path), "--db", db)[0] == 0
    doc = json.loads(doc_path.read_text())
    assert doc["run"]["run_id"] == run_id and doc["events"][0]["type"] == "run_start"
    assert json.loads(trace_path.read_text())["traceEvents"]
    code, out, _ = run_cli(capsys, "export", run_id, "--db", db)
    assert code == 0 and json.loads(out) == doc
    assert run_cli(capsys, "export", "r_nope", "--db", db)[0] == 2


def test_compare_prints_a_table_and_stores_runs_and_comparison(capsys, db):
    code, out, _ = run_cli(capsys, "compare", PROMPT, "--modes", "ar,block_diffusion,linear_spec",
                           "--max-new-tokens", "8", "--param", "block_size=4", "--slots", "2048", "--db", db)
    assert code == 0
    header, *rows = out.splitlines()[:4]
    assert header.split()[:6] == ["mode", "NFE", "TPF", "tok/s", "mean", "acc"]
    assert [row.split()[0] for row in rows] == ["ar", "block_diffusion", "linear_spec"]
    assert "(ref)" in rows[0] and all(re.search(r"\s(yes|no)\s", row) for row in rows[1:])
    picks = [re.search(r"\s(\d+)/(\d+) \((\d+\.\d+)\)\s", row) for row in rows]
    assert all(picks), "each mode's answer rated by the model: its greedy picks of all tokens (NLL)"
    for lossless in (picks[0], picks[2]):    # ar and linear_spec give the model's own pick at every token
        assert lossless.group(1) == lossless.group(2) != "0"
    comparison_id = re.search(r"comparison (c_\w+)", out).group(1)
    with Store(db) as store:
        comparison = store.get_comparison(comparison_id)
        runs = [store.get_run(r) for r in comparison["run_ids"]]
    assert [r["mode"] for r in runs] == ["ar", "block_diffusion", "linear_spec"]
    assert all(r["status"] == "done" and r["prompt"] == PROMPT for r in runs)
    assert "block_size" not in runs[0]["params"] and runs[2]["params"]["block_size"] == 4


def test_compare_refuses_a_parameter_no_mode_takes(capsys, db):
    code, _, err = run_cli(capsys, "compare", PROMPT, "--modes", "ar", "--param", "block_size=4", "--db", db)
    assert code == 2 and "block_size" in err


def test_serve_refuses_a_public_bind_without_a_token(capsys, db):
    code, _, err = run_cli(capsys, "serve", "--host", "0.0.0.0", "--db", db)
    assert code == 2 and "token" in err


@pytest.mark.slow   # several seconds: left out of make test-fast
def test_console_script(tmp_path):
    script = Path(sys.executable).with_name("specscope")
    result = subprocess.run([str(script), "runs", "ls", "--db", f"sqlite:///{tmp_path / 'empty.db'}"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.split()[:2] == ["run", "created"]


def test_run_takes_block_size_tiers_and_records_them(capsys, db):
    run_id, _ = generate(capsys, db, "linear_spec", "--param", "block_size=4", "--param", "verify=fixed",
                         "--block-size-tiers", "1:8,64:4")
    with Store(db) as store:
        events = store.events(run_id)
    assert events[0]["block_size_tiers"] == [[1, 8], [64, 4]]
    assert {e["block_size"] for e in events if e["type"] == "round" and e["round"] > 0} == {8}
    code, _, err = run_cli(capsys, "run", PROMPT, "--mode", "ar", "--db", db, "--block-size-tiers", "1:32")
    assert code != 0 and "catch-all" in err


def test_run_takes_the_machine_cost_curve_as_a_logged_step_or_the_one_it_is_given(capsys, db, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSCOPE_CACHE", str(tmp_path / "cache"))
    code, out, err = run_cli(capsys, "run", PROMPT, "--mode", "ar", "--max-new-tokens", "2", "--slots", "2048",
                             "--db", db)
    assert code == 0 and "specscope: cost curve: 1:" in err and "load average" in err
    run_id = re.search(r"^run (r_\w+)", out, re.MULTILINE).group(1)
    with Store(db) as store:
        measured = store.events(run_id)[0]["cost_curve"]
    assert measured["provenance"]["source"] in ("measured", "cache") and measured["provenance"]["seconds"] > 0
    kept = list((tmp_path / "cache").glob("cost_curves/*.json"))
    assert len(kept) == (0 if measured["provenance"]["busy"] else 1)   # a busy machine's curve is not kept
    given = tmp_path / "curve.json"
    given.write_text(json.dumps({"cost_curve": {"ms": {"1": 2.0, "4": 3.0}}}))   # /api/health's shape
    code, out, err = run_cli(capsys, "run", PROMPT, "--mode", "ar", "--max-new-tokens", "2", "--slots", "2048",
                             "--cost-curve", str(given), "--db", db)
    run_id = re.search(r"^run (r_\w+)", out, re.MULTILINE).group(1)
    with Store(db) as store:
        assert store.events(run_id)[0]["cost_curve"]["ms"] == {"1": 2.0, "4": 3.0}
    assert code == 0 and "cost curve" not in err
    code, _, err = run_cli(capsys, "run", PROMPT, "--mode", "ar", "--cost-curve", str(tmp_path / "none.json"),
                           "--db", db)
    assert code == 2 and "--cost-curve" in err
