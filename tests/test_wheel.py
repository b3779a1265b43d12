"""The project as a built wheel installs it, under the one top-level import `specscope` (so Hugging Face's `kernels`,
which transformers requires, installs beside it): every file the code reads at run time is in the wheel (the C sources
the CPU kernels compile, the UI's scripts and styles, the shipped adapter and its card), and the installed
package builds its fused CPU step from there, outside this checkout, and runs every mode (the lossless ones equal
to their references)."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ADAPTER = "specscope/backend/model/checkpoints/smollm2-135m-selfspec"
RUNTIME_FILES = [*(f"specscope/kernels/{name}" for name in ("cpu_decode.c", "cpu_fold.c", "simd.h", "api.h")),
                 *(f"specscope/app/static/{name}" for name in ("viz.js", "specscope.js", "specscope.css")),
                 *(f"{ADAPTER}/{name}" for name in ("adapter_config.json", "adapter_model.safetensors",
                                                     "sampler_head.safetensors", "model_card.json"))]

pytestmark = pytest.mark.slow

INSTALLED_CHECK = """
import sys
from pathlib import Path
import specscope.app.ui as ui, specscope.kernels.native as native
assert not str(Path(native.__file__)).startswith(sys.argv[1]), native.__file__   # the installed copy, not the checkout
assert ui.STATIC.joinpath("viz.js").is_file(), ui.STATIC
assert native.library() is not None   # the C kernels built from the installed package
import kernels as hf_kernels, transformers, transformers.activations   # Hugging Face's `kernels` beside ours
assert hasattr(hf_kernels, "get_kernel"), hf_kernels.__file__
assert int(transformers.__version__.split(".")[0]) >= 5
from specscope.backend.engine.engine import Engine
from specscope.backend.engine.modes import get_mode, mode_names
from specscope.backend.model.checkpoint import load_checkpoint
from specscope.backend.model.source import TINY
engine = Engine(load_checkpoint(TINY), num_slots=1024)
assert engine.rt.backend is not engine.rt.eager   # the fused step, from the installed C source
outputs = {m: engine.generate("Copy: a b c", m, {"max_new_tokens": 8}) for m in mode_names()}
for mode, result in outputs.items():
    assert result.status == "done" and result.output_ids, (mode, result.error)
    reference = get_mode(mode).lossless_vs
    assert reference is None or result.output_ids == outputs[reference].output_ids, mode
print("ok")
"""


def test_wheel_holds_what_the_code_reads(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(ROOT)], check=True, capture_output=True, timeout=300)
    wheel = next(tmp_path.glob("specscope-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    top_level = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"specscope"}
    assert [f for f in RUNTIME_FILES if f not in names] == []
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    done = subprocess.run([sys.executable, "-c", INSTALLED_CHECK, str(ROOT)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin",
                                                       "HOME": str(tmp_path)})
    assert done.stdout.strip() == "ok", done.stderr[-2000:]
