"""A short benchmark on the served model, run through the engine service as any client's runs are: a few prompts of
`ar` and of one speculative mode, one run at a time, so the Bench tab can show this machine's figures beside the
stored ones (which were measured elsewhere). Its runs are not stored."""
from __future__ import annotations

import os
import platform
import threading
import time
from pathlib import Path
from typing import Any

from specscope.backend.engine.modes import baseline
from specscope.backend.server.service import EngineService
from specscope.backend.tracing import RecordingTracer

HERE_PROMPTS = ("Count from 3 to 9.", "Reverse: q w e r t y u i", "Write a short poem about the sea.")
HERE_TOKENS = 32
"""max_new_tokens of each run: the whole benchmark stays a few seconds long on the shipped model."""
RUN_TIMEOUT_S = 120.0
"""How long one run may take before the benchmark gives up (and cancels it)."""


def cpu_name() -> str:
    """The CPU's model name (as `lscpu` says it, which the stored benchmarks cite), else the architecture."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    named = (line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    return next(named, platform.processor() or platform.machine())


class BenchTimeout(RuntimeError):
    """A run of the benchmark did not end in time."""


def one_run(engine: EngineService, prompt: str, mode: str, max_new_tokens: int) -> dict[str, Any]:
    """The run_end metrics of one run of `mode` on `prompt`; ParamError or Busy when the engine refuses it."""
    ended = threading.Event()
    end: dict[str, Any] = {}

    def sink(event: dict[str, Any]) -> None:
        if event["type"] == "run_end":
            end.update(event)
            ended.set()

    run = engine.submit(prompt, mode, {"max_new_tokens": max_new_tokens}, RecordingTracer(sink=sink, keep=False))
    run.admitted.result(RUN_TIMEOUT_S)
    if not ended.wait(RUN_TIMEOUT_S):
        run.cancel()
        raise BenchTimeout(f"a {mode} run took over {RUN_TIMEOUT_S:.0f} s")
    return end["metrics"]


def measure(engine: EngineService, mode: str, prompts: tuple[str, ...], max_new_tokens: int) -> dict[str, Any]:
    """tok/s (tokens over wall time, summed over the prompts) and TPF (tokens over forwards) of one mode."""
    runs = [one_run(engine, p, mode, max_new_tokens) for p in prompts]
    tokens, nfe = sum(m["tokens"] for m in runs), sum(m["nfe"] for m in runs)
    wall_ms = sum(m["wall_ms"] for m in runs)
    return {"tokens": tokens, "nfe": nfe, "wall_ms": wall_ms, "tpf": tokens / nfe if nfe else None,
            "tok_per_s": tokens / wall_ms * 1000 if wall_ms else None}


def bench_here(engine: EngineService, mode: str, prompts: tuple[str, ...] = HERE_PROMPTS,
               max_new_tokens: int = HERE_TOKENS) -> dict[str, Any]:
    """The baseline (the exact mode, `ar`) and `mode` on the served model, with where and on what they ran."""
    model = engine.model
    modes = {m: measure(engine, m, prompts, max_new_tokens) for m in dict.fromkeys((baseline(), mode))}
    return {"model": model.name, "matmul": model.matmul, "cpu": cpu_name(), "cores": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "prompts": len(prompts),
            "max_new_tokens": max_new_tokens, "modes": modes}
