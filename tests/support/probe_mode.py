"""A mode that exists only for the tests that register it (`registered`): it declares everything a mode declares
(colour, lossless claim, draft length under a row budget, a picker that chooses it, a metric column of its own)
and runs `ar`'s decode step, so its tokens are the model's own. The product must take it in through the registry
alone: no file outside engine/modes/ may need to know it."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from specscope.backend.engine.ask import Round
from specscope.backend.engine.modes import REGISTRY, mode_names, register
from specscope.backend.engine.modes.ar import decode_round
from specscope.backend.engine.modes.base import Column, Mode
from specscope.backend.engine.params import Param
from specscope.backend.engine.request import Request
from specscope.backend.engine.runtime import Runtime

NAME = "probe_mode"
COLOR = "#d946ef"


class ProbeMode(Mode):
    """Not decorated with @register: only `registered` puts it in the registry, and takes it out again."""
    name = NAME
    color = COLOR
    summary = "test-only: the model's own decode step, with a draft length a tier fits to its budget"
    nfe_note = "one forward per token; prefill not counted"
    explain = "Test-only probe: one decode step a round; its draft length under the tier in force is recorded."
    lossless_vs = "ar"
    needs_mask = False
    draft_param = "n"
    picked = {"compare": 99}
    columns = (Column("probe_rounds", "probe rounds", "rounds the test-only probe mode ran", "0"),)
    params = (Param("n", int, 3, 1, 6, "the draft length a round would have at its own parameters"),)

    def draft_rows(self, length: int) -> int:
        return 3 * length - 1

    def extra_positions(self, params: dict[str, Any]) -> int:
        return 1

    def start(self, req: Request, rt: Runtime) -> dict[str, Any]:
        return {"rounds": 0}

    def round(self, req: Request, rt: Runtime) -> Round:
        req.state["rounds"] += 1
        fitted = self.draft_length(req.params["n"], req.draft_rows)
        return (yield from decode_round(req, rt, {"probe_length": fitted}))

    def metrics(self, req: Request) -> dict[str, Any]:
        return {"probe_rounds": req.state["rounds"] if isinstance(req.state, dict) else 0}


@contextmanager
def registered(*engines: Any) -> Iterator[type[ProbeMode]]:
    """The probe mode in the registry for the length of the block, then gone again, also from the policies of the
    given engines (which keep one instance per mode name)."""
    mode_names()                 # the real modes are loaded first, so nothing registers after the probe
    register(ProbeMode)
    try:
        yield ProbeMode
    finally:
        REGISTRY.pop(NAME, None)
        for engine in engines:
            engine.scheduler.policies.pop(NAME, None)
