"""Shared fixtures. TRITON_INTERPRET must be set before any kernel module is imported.

Markers (pyproject.toml): `slow` (over ~5 s on a loaded 2-core machine), `browser` (drives Chromium), `postgres`
(needs the throwaway PostgreSQL server of tests/support/postgres.py), `real_model`. `make test-fast` deselects
all four."""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest  # noqa: E402
import torch  # noqa: E402

from specscope.backend.model.checkpoint import load_checkpoint  # noqa: E402
from specscope.backend.train.tasks import task_set  # noqa: E402

# Under pytest-xdist (`make test`, `make test-fast`: one worker a core) each worker gets one thread.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)


@pytest.fixture(scope="session")
def loaded():
    """The shipped tiny checkpoint, fp32."""
    return load_checkpoint()


@pytest.fixture(scope="session")
def heldout_prompts():
    """36 held-out task prompts (values never seen in training), 4 of each of the 9 task families."""
    return [t.prompt for t in task_set("heldout", 4)]


@pytest.fixture
def engine(loaded):
    from specscope.backend.engine.engine import Engine
    return Engine(loaded, num_slots=4096, check_invariants=True)


@pytest.fixture(scope="module")
def _module_engine(loaded):
    from specscope.backend.engine.engine import Engine
    return Engine(loaded, num_slots=4096, check_invariants=True)


@pytest.fixture
def shared_engine(_module_engine):
    """`engine`, but one per module (building an engine converts the weights for the fused decode: ~1 s, more than
    many a short test takes). Each test must leave it as it found it; this checks that after every test, so a leak
    fails the test that made it, never the next one."""
    yield _module_engine
    assert _module_engine.rt.pool.used == 0, "the test left KV slots held"
    assert not _module_engine.scheduler.has_work, "the test left requests queued or running"


@pytest.fixture(scope="module")
def one_thread():
    """Tiny random models: one intra-op thread is fastest and does not contend with other work."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def spiffy_engine(loaded, tmp_path_factory):
    """An engine on the shipped model with the test draft graph (support.spiffy.NODES) instead of the shipped one."""
    from support.spiffy import engine_with_graph, graph_json
    return engine_with_graph(loaded, tmp_path_factory.mktemp("graph"), graph_json())


class HeldoutRuns:
    """Runs of one mode and parameters on the held-out prompts, all in one engine.run (continuous batching),
    each kept for the session: the lossless checks of tests/test_modes.py and the mode files' checks on the same
    runs (tests/test_spiffy.py, tests/test_specfold.py) share them, and a mode that is another's reference (spiffy
    for specfold, ar for several) runs once."""

    def __init__(self, engine: Any, prompts: list[str]):
        self.engine = engine
        self.prompts = prompts
        self._runs: dict[tuple, list[Any]] = {}

    def __call__(self, mode: str, params: dict[str, Any], prompts: Sequence[str] | None = None) -> list[Any]:
        prompts = tuple(self.prompts if prompts is None else prompts)
        key = (mode, tuple(sorted(params.items())), prompts)
        if key not in self._runs:
            eng = self.engine
            self._runs[key] = eng.run([eng.new_request(p, mode, params) for p in prompts])
            assert eng.rt.pool.used == 0 and not eng.scheduler.has_work
        return self._runs[key]


@pytest.fixture(scope="session")
def heldout_runs(loaded, heldout_prompts):
    """heldout_runs(mode, params, prompts=None): the RunResults of `mode` on the held-out prompts (or `prompts`),
    on an engine of the shipped checkpoint (its own draft graph) that checks KV invariants every round."""
    from specscope.backend.engine.engine import Engine
    return HeldoutRuns(Engine(loaded, num_slots=4096, check_invariants=True), heldout_prompts)

