"""The load and fault script at small scale on the tiny model: every phase's check passes, and its figures are
there per mode (the full-scale run on the default model is the README's)."""
import json

import pytest

from backend import loadtest

pytestmark = [pytest.mark.slow, pytest.mark.extended]


def test_small_load_run_passes_every_check(tmp_path, capsys):
    out = tmp_path / "load.json"
    code = loadtest.main(["--spawn", "--model", "tiny", "--clients", "4", "--requests", "8", "--max-tokens", "8",
                          "--max-queued", "4", "--modes", "ar,linear_spec", "--out", str(out)])
    report = json.loads(out.read_text())
    assert code == 0 and report["ok"], capsys.readouterr().out
    assert report["store"]["runs_made"] == 8 and report["busy"]["refused_429"] >= 1
    assert report["disconnects"]["statuses"] == ["cancelled"]
    for mode in ("ar", "linear_spec"):
        figures = report["load"][mode]
        assert figures["ok"] == figures["requests"] == 4 and figures["tokens"] > 0
        assert 0 < figures["ttft_p50_s"] <= figures["ttft_p99_s"]
