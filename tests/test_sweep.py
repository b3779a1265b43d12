"""`specscope sweep`: a spec that cannot run is refused by what is wrong in it, before anything runs; a grid's cells
are every mode × parameter combination × prompt × repeat, and a local sweep stores each once with its cell."""
import json

import pytest

from specscope.backend.cli import main
from specscope.backend.engine.engine import Engine
from specscope.backend.store import Store
from specscope.lab.sweep import SpecError, Sweep, execute, load_spec, run_local, stored_cells


def prompts(model, count):
    return ["Count from 3 to 9.", "Copy: a b c", "Reverse: q w e"][:count]


@pytest.mark.parametrize(("doc", "needle"), [
    ({"modes": {"warp": {}}}, "unknown mode 'warp'"),
    ({"modes": []}, "a sweep spec is a mapping"),
    ({"modes": {"isd": [2, 4]}}, "isd's parameters are a mapping"),
    ({"modes": {"isd": {}}, "prompts": "missing.jsonl"}, "JSONL file"),
])
def test_a_bad_spec_is_refused_by_what_is_wrong(tmp_path, doc, needle) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps(doc))
    with pytest.raises(SpecError, match=needle):
        load_spec(spec, "tiny", prompts)


def test_the_cli_names_a_bad_spec_and_stores_nothing(tmp_path, capsys) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("modes: {isd: {n: [2]}, nope: {}}")
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    assert main(["sweep", str(spec), "--db", db]) != 0
    assert "unknown mode 'nope'" in capsys.readouterr().err
    assert Store(db).list_runs() == []


def test_a_local_sweep_stores_every_cell_once_and_a_rerun_runs_none(loaded, tmp_path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("name: g\nmodes:\n  isd: {n: [2, 3]}\n  ar:\nrepeats: 2\ncount: 2\nmax_new_tokens: 8\n")
    sweep = load_spec(spec, "tiny", prompts)
    assert isinstance(sweep, Sweep) and len(sweep.cells) == (2 + 1) * 2 * 2
    engine = Engine(loaded, num_slots=1024, check_invariants=True)
    store = Store(f"sqlite:///{tmp_path / 'runs.db'}")
    ran = []

    def local(todo, keep):
        ran.append(len(todo))
        run_local(sweep, engine, todo, keep)
    rows = execute(sweep, store, local, out=lambda _: None)
    execute(sweep, store, local, out=lambda _: None)
    assert ran == [12, 0] and len(stored_cells(store, "g")) == 12
    assert {r["row"]: r["runs"] for r in rows} == {"ar": 4, "isd n=2": 4, "isd n=3": 4}
    assert next(r for r in rows if r["row"] == "ar")["vs_ar"] == 1.0
    cells = [r["cell"] for r in store.list_runs(sweep="g", limit=100)]
    assert sorted(json.dumps(c, sort_keys=True) for c in cells) == sorted(
        json.dumps(c.as_dict(), sort_keys=True) for c in sweep.cells)
