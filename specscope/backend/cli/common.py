"""What the commands share: the user error, parameters from `k=v` pairs, the engine the model options name, a
traced run, and plain-text tables."""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specscope.backend.engine.messages import Prompt, check_messages
from specscope.backend.engine.params import ParamError
from specscope.backend.store import StoreWriter, Tee

if TYPE_CHECKING:
    from specscope.backend.engine.engine import Engine, RunResult

Event = dict[str, Any]
NUMBER = re.compile(r"^(-?\d+(\.\d+)?|-)$")



STEPS = "specscope"
"""The logger whose records (and its children's) the commands show from INFO up: steps such as the cost curve's
measurement (engine/cost_measure.py), which a command takes explicitly and says so."""


def show_steps() -> None:
    """Show specscope's INFO records on stderr, once per process (the CLI, and the engine process `serve` builds
    its engine in); they still reach the root logger's handlers too."""
    import logging

    class Steps(logging.StreamHandler):   # type: ignore[type-arg]
        """Writes to the sys.stderr of the moment (a test's capture, a redirect made later), not the one it began
        with."""
        @property   # type: ignore[override]
        def stream(self) -> Any:
            return sys.stderr

        @stream.setter
        def stream(self, _: Any) -> None:
            pass

    logger = logging.getLogger(STEPS)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    if not any(type(h).__name__ == "Steps" for h in logger.handlers):
        handler = Steps()
        handler.setFormatter(logging.Formatter("specscope: %(message)s"))
        logger.addHandler(handler)


class CLIError(Exception):
    """A user error: printed as `specscope: error: ...`, exit status 2."""


def parse_params(pairs: Sequence[str], max_new_tokens: int | None) -> dict[str, Any]:
    """`k=v` pairs; v is read as JSON when it parses (0.9, 4, true), else kept as a string."""
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CLIError(f"--param takes key=value, got {pair!r}")
        try:
            params[key] = json.loads(value)
        except ValueError:
            params[key] = value
    if max_new_tokens is not None:
        params["max_new_tokens"] = max_new_tokens
    return params


def build_engine(args: argparse.Namespace) -> Engine:
    """The engine the model options name: device, dtype, adapter, KV pool (sized from free memory when not
    given, at most what the scheduler can hold), block-size tiers and intra-op threads, pricing rows with this
    curve --cost-curve names (`with_cost_curve`). Raises ParamError or CheckpointError."""
    import torch

    from specscope.backend.cli.options import load_from_args
    from specscope.backend.engine.draft_tiers import draft_tiers_of
    from specscope.backend.engine.engine import Engine
    from specscope.backend.engine.scheduler import MAX_RUNNING, parse_tiers
    if args.threads:
        torch.set_num_threads(args.threads)
    tiers = parse_tiers(args.block_size_tiers) if args.block_size_tiers else None
    loaded, slots = load_from_args(args, at_most_per_sequence=MAX_RUNNING)
    engine = with_cost_curve(Engine(loaded, num_slots=slots, tiers=tiers, matmul=args.matmul,
                                    forward=getattr(args, "forward", "auto")),
                             getattr(args, "cost_curve", "machine"))
    engine.scheduler.draft_tiers = draft_tiers_of(args.draft_tiers, engine.cost_curve)
    return engine


def with_cost_curve(engine: Engine, spec: str = "machine") -> Engine:
    """The commands' explicit cost-curve step (--cost-curve): `machine` loads this machine's curve for the engine's
    model and precision from the cache, or measures it now through its runtime (logged, with its provenance; a busy
    machine's is used and not kept); `flat` prices rows as free; anything else is a curve's JSON file. The curve is
    handed to the engine."""
    from specscope.backend.engine.cost_curve import FLAT, CostCurve
    from specscope.backend.engine.cost_measure import COST_PROMPT, machine_curve
    if spec == "machine":
        curve = machine_curve(engine.rt, engine.encode_prompt(COST_PROMPT, raw=False))
    elif spec == "flat":
        curve = FLAT
    else:
        try:
            doc = json.loads(Path(spec).read_text())
            curve = CostCurve.from_json(doc.get("cost_curve", doc))
        except (OSError, ValueError, AttributeError) as e:
            raise CLIError(f"--cost-curve {spec}: not machine, flat or a cost curve's JSON file ({e})") from None
    engine.use_cost_curve(curve)
    return engine


def load_engine(args: argparse.Namespace) -> Engine:
    """build_engine, its errors as CLIError."""
    from specscope.backend.forward.choice import ForwardUnavailable
    from specscope.backend.forward.fused_step import MatmulUnavailable
    from specscope.backend.model.config import CheckpointError
    try:
        return build_engine(args)
    except (ParamError, CheckpointError, MatmulUnavailable, ForwardUnavailable) as e:
        raise CLIError(str(e)) from None


def folder_options(args: argparse.Namespace, folder: str | Path) -> argparse.Namespace:
    """The same model options for another model, a name or a checkpoint folder (its own shipped adapter, unless
    --adapter none)."""
    return argparse.Namespace(**{**vars(args), "model": str(folder),
                                 "adapter": "none" if args.adapter == "none" else None})


def first_model(models_dir: str) -> str | None:
    """The first loadable folder of a models directory, or None."""
    from specscope.backend.model.catalog import scan
    return next((e.path for e in scan(models_dir) if e.loadable), None)


def run_traced(engine: Engine, writer: StoreWriter | None, prompt: Prompt, mode: str, params: dict[str, Any],
               *listeners: Callable[[Event], None]) -> RunResult:
    """One traced run, stored as it goes (and fully stored on return); Ctrl-C cancels it cleanly (stored as
    cancelled) and re-raises."""
    req = engine.new_request(prompt, mode, params, Tee(writer, *listeners).tracer())
    try:
        return engine.run([req])[0]
    except KeyboardInterrupt:
        req.cancel.set()
        while engine.scheduler.has_work:
            engine.scheduler.step()
        raise
    finally:
        if writer is not None:
            writer.flush()


def fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def metrics_line(res: RunResult) -> str:
    m = res.metrics
    return (f"{res.mode} · {res.status} · {m['tokens']} tokens · NFE {m['nfe']} · TPF {fmt(m['tpf'])} · "
            f"{fmt(m['tok_per_s'], '.1f')} tok/s · tokens/round {fmt(m['accept_len_mean'])} · "
            f"KV peak {m['kv_peak']} · {m['wall_ms']:.0f} ms")


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Plain-text table; columns holding only numbers (or "-") are right-aligned."""
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    numeric = [all(NUMBER.match(row[i]) for row in cells[1:]) for i in range(len(header))]
    lines = ("  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric, strict=True))
             for row in cells)
    return "\n".join(line.rstrip() for line in lines)


def conversation(args: argparse.Namespace) -> Prompt:
    """The prompt or conversation the options give (exactly one of prompt / --messages), --system first."""
    if (args.prompt is None) == (args.messages is None):
        raise CLIError("give a prompt or --messages (one of them)")
    if args.messages is None:
        if args.system is None:
            return args.prompt
        messages: Any = [{"role": "user", "content": args.prompt}]
    else:
        text = args.messages
        if text == "-":
            text = sys.stdin.read()
        elif not text.lstrip().startswith("[") and Path(text).is_file():
            text = Path(text).read_text()
        try:
            messages = json.loads(text)
        except ValueError as e:
            raise CLIError(f"--messages is not a JSON list of messages ({e})") from None
    if args.system is not None:
        messages = [{"role": "system", "content": args.system}, *messages]
    return check_messages(messages)
