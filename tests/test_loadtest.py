"""The load and fault script at small scale on the tiny model: every phase's check passes, and its figures are
there per mode (the full-scale run on the default model is the README's)."""
import json
import shlex

import pytest
from support.postgres import own_cluster

from specscope.backend.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.extended]
pytest_plugins = ["support.postgres"]  # the pg_cluster fixture


def test_small_load_run_passes_every_check(tmp_path, capsys):
    out = tmp_path / "load.json"
    code = main(["loadtest", "--spawn", "--model", "tiny", "--clients", "4", "--requests", "8", "--max-tokens", "8",
                          "--max-queued", "4", "--modes", "ar,linear_spec", "--out", str(out)])
    report = json.loads(out.read_text())
    assert code == 0 and report["ok"], capsys.readouterr().out
    assert report["store"]["runs_made"] == 8 and report["busy"]["refused_429"] >= 1
    assert report["disconnects"]["statuses"] == ["cancelled"]
    for mode in ("ar", "linear_spec"):
        figures = report["load"][mode]
        assert figures["ok"] == figures["requests"] == 4 and figures["tokens"] > 0
        assert 0 < figures["ttft_p50_s"] <= figures["ttft_p99_s"]


@pytest.mark.postgres
def test_store_outage_phase_loses_no_acknowledged_run(tmp_path, capsys) -> None:
    """The outage phase on a PostgreSQL server of its own, stopped and started by the script's shell commands."""
    with own_cluster() as cluster:
        out = tmp_path / "outage.json"
        code = main(["loadtest",
            "--spawn", "--model", "tiny", "--db", cluster.new_database(), "--phases", "outage", "--clients", "4",
            "--max-tokens", "400", "--outage-s", "3", "--out", str(out),
            "--store-stop", shlex.join(cluster.pg_ctl_command("-m", "fast", "-w", "stop")),
            "--store-start", shlex.join(cluster.start_command())])
        report = json.loads(out.read_text())
        assert code == 0 and report["ok"], capsys.readouterr().out
        outage = report["outage"]
        assert outage["streaming_at_stop"] > 0 and outage["stored_as_answered"] == outage["answered"] == 4
        assert outage["runs_read_during"] == 503 and outage["health_store_during"] == "unavailable"


def test_levels_phase_reports_each_mode_alone_and_mixed_and_their_shared_forwards(tmp_path, capsys):
    out = tmp_path / "levels.json"
    code = main(["loadtest", "--spawn", "--model", "tiny", "--phases", "levels", "--levels", "1,4", "--max-tokens", "8",
                 "--modes", "ar,isd", "--out", str(out)])
    report = json.loads(out.read_text())
    assert code == 0 and report["ok"], capsys.readouterr().out
    rows = {(r["clients"], r["modes"]): r for r in report["levels"]}
    assert set(rows) == {(1, "ar"), (1, "isd"), (4, "ar"), (4, "isd"), (4, "mixed")}
    assert all(r["ok"] == r["clients"] and r["tok_per_s"] > 0 for r in rows.values())
    assert rows[(1, "isd")]["requests_per_forward"] == 1 and rows[(4, "isd")]["requests_per_forward"] > 1
    assert rows[(4, "mixed")]["requests_per_forward"] > 1   # ar decode steps and isd verifies share forwards
