"""`specscope sweep SPEC.yaml`: a grid of runs, stored with the sweep's id and cell, resumable (lab/sweep.py)."""
from __future__ import annotations

import argparse
import functools
from pathlib import Path

from specscope.backend.cli.common import CLIError, build_engine, load_engine
from specscope.backend.cli.options import model_options, store_options
from specscope.backend.store import Store

PARENTS = (store_options, model_options)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="the sweep's YAML spec: name, model, modes with parameter lists, prompts (heldout or "
                                "a JSONL file), count, repeats, max_new_tokens")
    p.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="spread the runs over Ray actors, one engine each: join the cluster at ADDRESS, or with no "
                        "address start one on this machine (needs the ray extra: pip install 'specscope[ray]')")
    p.add_argument("--workers", type=int, default=2, help="with --ray: engines (Ray actors) that run the cells")


def held_out(args: argparse.Namespace, model: str | None, count: int) -> list[str]:
    """The model's held-out prompts, as the bench takes them."""
    from specscope.backend.model.source import resolve
    from specscope.lab.bench import bench_prompts
    folder = resolve(model).folder
    tasks, _ = bench_prompts(folder, argparse.Namespace(per_kind=-(-count // 9), prompts=count))
    return [t.prompt for t in tasks][:count]


def run(args: argparse.Namespace) -> int:
    from specscope.lab.sweep import SpecError, execute, load_spec, run_local
    try:
        sweep = load_spec(Path(args.spec), args.model, functools.partial(held_out, args))
    except SpecError as e:
        raise CLIError(str(e)) from None
    args.model = sweep.model
    store = Store(args.db)
    try:
        if args.ray is None:
            engine = load_engine(args)
            execute(sweep, store, lambda todo, keep: run_local(sweep, engine, todo, keep))
        else:
            try:
                from specscope.lab.sweep_ray import run_on_ray
            except ImportError:
                raise CLIError("--ray needs Ray: pip install 'specscope[ray]'") from None
            build = functools.partial(build_engine, args)
            execute(sweep, store, lambda todo, keep: run_on_ray(sweep, build, todo, keep, args.ray, args.workers))
    finally:
        store.close()
    return 0
