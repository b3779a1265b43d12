"""`specscope gpu-check --tiny`: every registered mode on the shipped model and on the tiny synthetic
Nemotron-shaped model, on CPU, with its report and the kernels bench."""
from __future__ import annotations

import json

import pytest
import torch

from specscope.backend.cli import main
from specscope.backend.engine.modes import describe_modes, mode_names
from specscope.lab.gpu_check import variants


@pytest.mark.extended
@pytest.mark.usefixtures("one_thread")
def test_gpu_check_tiny(tmp_path):
    assert main(["gpu-check", "--tiny", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    rows = {(r["target"], r["mode"]): r for r in report["modes"]}
    rows_per_model = [row for m in describe_modes() for row, _ in variants(m)]
    approximate = {m["name"] for m in describe_modes() if len(variants(m)) > 1}  # lossless only in their exact row
    assert set(rows) == {(t, m) for t in ("shipped", "synthetic-nld-tiny") for m in rows_per_model}
    assert set(mode_names()) <= set(rows_per_model)
    for (target, mode), r in rows.items():
        assert r["status"] == "ok", (target, mode, r["note"])
        assert r["tokens"] > 0 and r["nfe"] > 0 and r["kv_peak"] > 0
        if target == "shipped" and r["lossless_vs"] and mode not in approximate:
            assert r["same_as_ref"] == 1.0, mode
    assert json.loads((tmp_path / "kernels.json").read_text())
    assert (tmp_path / "report.md").read_text().count("\n") == len(rows) + 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_check_on_cuda(tmp_path):
    """On a GPU: every mode on the shipped model (fp32, lossless equalities hard) and the synthetic 8B (bf16), then
    the kernels bench."""
    assert main(["gpu-check", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["modes"] and all(r["status"] == "ok" for r in report["modes"])
    assert json.loads((tmp_path / "kernels.json").read_text())
