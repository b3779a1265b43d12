"""The `specscope` command. Each subcommand is a module with HELP, PARENTS (the shared option groups it takes),
add_arguments(parser) and run(args); a module is imported only when its subcommand runs, so `--help` and
`specscope runs ls` stay quick."""
from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from specscope.backend.cli.common import CLIError, show_steps
from specscope.backend.engine.params import ParamError
from specscope.backend.store import StoreError

COMMANDS = {
    "serve": ("specscope.backend.cli.serve", "serve the UI, REST and websockets"),
    "run": ("specscope.backend.cli.run", "generate once, streaming text; store the run"),
    "compare": ("specscope.backend.cli.compare", "run several modes on one prompt"),
    "export": ("specscope.backend.cli.export", "write a stored run as JSON or a Perfetto trace"),
    "runs": ("specscope.backend.cli.runs", "list, show or delete stored runs"),
    "diverge": ("specscope.backend.cli.diverge", "why two stored runs of one prompt differ: the first differing "
                                                 "token, re-scored"),
    "bench": ("specscope.lab.bench", "benchmark the modes on held-out prompts"),
    "calibrate": ("specscope.lab.calibrate", "calibrate the spiffy / specfold draft graph"),
    "bench-diff": ("specscope.lab.bench_compare", "two sets of bench reports side by side (a change's before "
                                                      "and after)"),
    "bench-kernels": ("specscope.lab.kernel_bench", "dense against folded verification on a synthetic model "
                                                        "(a GPU's figures; --tiny on a CPU)"),
    "throughput": ("specscope.lab.throughput", "a mode's tok/s in process, traced and stored, and through a "
                                                   "server"),
    "sweep": ("specscope.lab.sweep_command", "a grid of runs (modes × parameters × prompts), stored and resumable, "
                                             "on this machine or a Ray cluster"),
    "loadtest": ("specscope.lab.loadtest", "a bounded load and fault run against a server over loopback"),
    "gpu-check": ("specscope.lab.gpu_check", "every mode on a GPU (--tiny: on the CPU), then bench-kernels"),
    "train": ("specscope.backend.cli.train", "train the tiny model, the self-speculation adapter or its head"),
    "data": ("specscope.backend.cli.data", "write the prompt set, or a model's own answers to it"),
}
"""Subcommand: (module, one-line help)."""


def build_parser(command: str | None = None) -> tuple[argparse.ArgumentParser, ModuleType | None]:
    """The parser, with the arguments of `command` alone (every other subcommand is a name and its help)."""
    parser = argparse.ArgumentParser(prog="specscope", description="Visual debugger for self-speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True)
    chosen = None
    for name, (module_name, help) in COMMANDS.items():
        if name != command:
            sub.add_parser(name, help=help, add_help=False)
            continue
        try:
            chosen = importlib.import_module(module_name)
        except ImportError as e:
            raise CLIError(f"{command} is not available: {e}") from None
        p = sub.add_parser(name, help=help, parents=[make() for make in getattr(chosen, "PARENTS", ())])
        chosen.add_arguments(p)
    return parser, chosen


def main(argv: Sequence[str] | None = None) -> int:
    from specscope.backend.model.config import CheckpointError

    show_steps()
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    try:
        parser, module = build_parser(command if command in COMMANDS else None)
        args = parser.parse_args(argv)
        assert module is not None
        status = module.run(args)
        return status if isinstance(status, int) else 0
    except (CLIError, ParamError, CheckpointError, StoreError) as e:
        print(f"specscope: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
