"""The machine's cost curve is a step a command takes, never a side effect: building an engine measures nothing and
writes nothing; a measurement carries its provenance; one made on a busy machine serves its process and is not kept
as the machine's; a kept one is read back as it was measured."""
from __future__ import annotations

import json
import os

import pytest

from specscope.backend.engine import cost_measure
from specscope.backend.engine.cost_curve import FLAT, CostCurve, Provenance
from specscope.backend.engine.cost_measure import COST_PROMPT, busy_reason, machine_curve, machine_key
from specscope.backend.engine.engine import Engine

CPUS = os.cpu_count() or 1


def test_building_an_engine_measures_nothing_and_writes_no_file(loaded, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SPECSCOPE_CACHE", str(tmp_path))
    engine = Engine(loaded, num_slots=512)
    assert engine.cost_curve is FLAT and engine.rt.forwards == 0
    assert list(tmp_path.iterdir()) == []
    given = CostCurve({1: 2.0, 4: 3.0})
    assert Engine(loaded, num_slots=512, cost_curve=given).cost_curve is given
    assert list(tmp_path.iterdir()) == []


def test_a_busy_measurement_serves_its_process_and_is_not_kept(shared_engine, tmp_path, caplog) -> None:
    ids = shared_engine.encode_prompt(COST_PROMPT, raw=False)
    busy = cost_measure.BUSY_LOAD * CPUS + 1.0
    with caplog.at_level("INFO", logger="specscope"):
        curve = machine_curve(shared_engine.rt, ids, folder=tmp_path, load=lambda: busy)
    p = curve.provenance
    assert p is not None and p.source == "measured" and not p.cached
    assert p.busy == f"load average {busy:.2f} is above {cost_measure.BUSY_LOAD:g} of {CPUS} CPUs"
    assert p.load_before == p.load_after == busy and p.cpus == CPUS and p.seconds > 0 and p.threads >= 1
    assert set(curve.ms) == set(cost_measure.ROWS) and min(curve.ms.values()) > 0
    assert list(tmp_path.iterdir()) == []                               # not kept
    assert "the machine was busy" in caplog.text and "not kept" in caplog.text
    again = machine_curve(shared_engine.rt, ids, folder=tmp_path, load=lambda: busy)
    assert again.provenance is not None and again.provenance.measured_at >= p.measured_at   # measured anew


def test_a_kept_curve_is_read_back_with_the_provenance_of_its_measurement(shared_engine, tmp_path) -> None:
    measured = Provenance("2026-01-02T03:04:05+00:00", 0.1, 0.2, 1.5, CPUS, 2, 0.03, None, cached=True)
    kept = CostCurve({1: 1.0, 2: 1.1, 16: 3.0}, measured)
    (tmp_path / f"{machine_key(shared_engine.rt)}.json").write_text(json.dumps(kept.to_json()))
    forwards = shared_engine.rt.forwards
    read = machine_curve(shared_engine.rt, [1, 2, 3], folder=tmp_path, load=lambda: 99.0)
    assert shared_engine.rt.forwards == forwards                        # nothing measured
    assert read == kept and read.provenance is not None
    assert read.provenance.source == "cache" and read.provenance.measured_at == measured.measured_at
    assert CostCurve.from_json(read.to_json()).to_json() == read.to_json()


def test_a_kept_curve_without_provenance_is_measured_anew(shared_engine, tmp_path) -> None:
    (tmp_path / f"{machine_key(shared_engine.rt)}.json").write_text(json.dumps(CostCurve({1: 16.5}).to_json()))
    curve = machine_curve(shared_engine.rt, shared_engine.encode_prompt(COST_PROMPT, raw=False), folder=tmp_path,
                          load=lambda: 99.0)
    assert curve.provenance is not None and curve.provenance.source == "measured" and set(curve.ms) != {1}


@pytest.mark.parametrize(("before", "after", "spread", "busy"), [
    (0.0, 0.1, 0.05, None),
    (cost_measure.BUSY_LOAD * CPUS + 0.5, 0.1, 0.05, "load average"),
    (0.0, cost_measure.BUSY_LOAD * CPUS + 0.5, 0.05, "load average"),
    (0.0, 0.0, cost_measure.SPREAD + 0.1, "timings unstable"),
])
def test_busy_means_loaded_or_unstable(before, after, spread, busy) -> None:
    reason = busy_reason(before, after, CPUS, spread)
    assert reason is None if busy is None else reason.startswith(busy)
