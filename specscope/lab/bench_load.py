"""`specscope bench --concurrency 1,4,16`: each mode alone and a mix of them, with N requests running at once on
one engine: aggregate tokens/s, time to first token and time between tokens (p50 / p99, from round events as they
leave the engine), round forwards per scheduler step and query rows per round forward (prefills left out)."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from specscope.backend.engine.engine import Engine
from specscope.backend.engine.modes import baseline
from specscope.backend.tracing import RecordingTracer

MIXED = "mixed"


@dataclass
class Clocked:
    """One request's round events as they arrive: when, and how many tokens each committed."""
    began: float
    arrivals: list[tuple[float, int]] = field(default_factory=list)

    def sink(self, event: dict[str, Any]) -> None:
        if event["type"] == "round" and event["committed"]:
            self.arrivals.append((time.perf_counter(), len(event["committed"])))

    def first_token_ms(self) -> float | None:
        return (self.arrivals[0][0] - self.began) * 1000 if self.arrivals else None

    def token_gaps_ms(self) -> list[float]:
        """The wait before each token after the first: a round's gap shared by the tokens it committed."""
        gaps = []
        for (before, _), (at, tokens) in itertools.pairwise(self.arrivals):
            gaps += [(at - before) * 1000 / tokens] * tokens
        return gaps


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def load_row(engine: Engine, modes: list[str], clients: int, prompts: list[str], params: dict[str, Any]) -> dict:
    """`clients` requests at once, their modes cycling through `modes`, their prompts through `prompts`."""
    steps, forwards, rows = engine.scheduler.steps, engine.rt.round_forwards, engine.rt.round_rows
    clocks, requests = [], []
    began = time.perf_counter()
    for i, mode in zip(range(clients), itertools.cycle(modes), strict=False):
        clock = Clocked(began)
        clocks.append(clock)
        tracer = RecordingTracer(sink=clock.sink, keep=False)
        requests.append(engine.new_request(prompts[i % len(prompts)], mode, params, tracer))
    results = engine.run(requests)
    wall = time.perf_counter() - began
    tokens = sum(r.metrics["tokens"] for r in results)
    firsts = [ms for c in clocks if (ms := c.first_token_ms()) is not None]
    gaps = [g for c in clocks for g in c.token_gaps_ms()]
    forwards, rows = engine.rt.round_forwards - forwards, engine.rt.round_rows - rows
    steps = engine.scheduler.steps - steps
    return {"clients": clients, "modes": modes, "tokens": tokens, "wall_s": wall, "tok_per_s": tokens / wall,
            "ttft_p50_ms": percentile(firsts, 0.5), "ttft_p99_ms": percentile(firsts, 0.99),
            "itl_p50_ms": percentile(gaps, 0.5), "itl_p99_ms": percentile(gaps, 0.99),
            "forwards_per_step": forwards / steps if steps else None, "rows_per_forward": rows / forwards,
            "statuses": sorted({r.status for r in results})}


def load_table(engine: Engine, modes: list[str], levels: list[int], prompts: list[str], max_new_tokens: int,
               repeats: int) -> list[dict]:
    """Every mode alone and the mix of all (where the clients cover every mode), at every level; each cell the
    median tok/s run of `repeats`."""
    params = {"max_new_tokens": max_new_tokens}
    load_row(engine, modes, len(modes), prompts, params)     # warm-up
    table = []
    for clients in levels:
        mixes = [(m, [m]) for m in modes] + ([(MIXED, modes)] if clients >= len(modes) else [])
        for label, mix in mixes:
            runs = sorted((load_row(engine, mix, clients, prompts, params) for _ in range(repeats)),
                          key=lambda r: r["tok_per_s"])
            table.append({"label": label, **runs[len(runs) // 2]})
    exact = baseline()
    for row in table:
        ar = next((r for r in table if r["label"] == exact and r["clients"] == row["clients"]), None)
        row["vs_ar"] = row["tok_per_s"] / ar["tok_per_s"] if ar else None
    return table


def markdown(table: list[dict], meta: dict[str, Any]) -> str:
    def f(x: float | None, spec: str) -> str:
        return "—" if x is None else format(x, spec)
    flags = ", ".join(meta.get("cpu_flags") or [])
    lines = [f"`specscope bench --concurrency` at commit {meta['commit']}, {meta['date']}, on {meta['cpu']} "
             f"({meta['cores']} cores; {flags}); {meta['model']}, matmuls {meta['matmul']}, draft tiers "
             f"{meta.get('draft_tiers') or 'none'}, max_new_tokens {meta['max_new_tokens']}, greedy; medians of "
             f"{meta['repeats']}.", "",
             f"| clients | modes | tok/s (all clients) | vs {baseline()} | TTFT p50 / p99 ms | between tokens p50 / "
             "p99 ms | forwards / step | rows / forward |", "|---|---|---|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r['clients']} | {r['label']} | {r['tok_per_s']:.1f} | {f(r['vs_ar'], '.2f')}× | "
                     f"{f(r['ttft_p50_ms'], '.0f')} / {f(r['ttft_p99_ms'], '.0f')} | "
                     f"{f(r['itl_p50_ms'], '.1f')} / {f(r['itl_p99_ms'], '.1f')} | "
                     f"{f(r['forwards_per_step'], '.2f')} | {f(r['rows_per_forward'], '.1f')} |")
    return "\n".join(lines) + "\n"
