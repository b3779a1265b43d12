"""`specscope runs ls|show|rm`: the stored runs. `ls --json` prints them whole, each with its run_end metrics: vLLM's
draft counts (engine/spec_counts.py), tpf, nfe and the acceptance alarm (engine/spec_alarm.py) among them."""
from __future__ import annotations

import argparse
import json

from specscope.backend.cli.common import CLIError, table
from specscope.backend.cli.options import store_options
from specscope.backend.store import Store

PARENTS = ()


def add_arguments(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(dest="runs_command", required=True)
    listing = actions.add_parser("ls", parents=[store_options()])
    listing.add_argument("--mode")
    listing.add_argument("--status")
    listing.add_argument("--limit", type=int, default=50)
    listing.add_argument("--json", action="store_true", help="print the runs as JSON, metrics included")
    listing.set_defaults(action=list_runs)
    for name, action in (("show", show_run), ("rm", remove_run)):
        one = actions.add_parser(name, parents=[store_options()])
        one.add_argument("run_id")
        one.set_defaults(action=action)


def run(args: argparse.Namespace) -> int:
    return args.action(args)


def list_runs(args: argparse.Namespace) -> int:
    with Store(args.db) as store:
        runs = store.list_runs(args.mode, args.status, args.limit)
    if args.json:
        print(json.dumps(runs, indent=2, ensure_ascii=False))
        return 0
    rows = [[r["run_id"], r["created_at"][:19], r["mode"], r["status"], r["n_tokens"], r["n_rounds"],
             r["server"] or "-", r["prompt"][:40].replace("\n", " ")] for r in runs]
    print(table(["run", "created (UTC)", "mode", "status", "tokens", "rounds", "server", "prompt"], rows))
    return 0


def show_run(args: argparse.Namespace) -> int:
    with Store(args.db) as store:
        run = store.get_run(args.run_id)
    if run is None:
        raise CLIError(f"no run {args.run_id}")
    print(json.dumps(run, indent=2, ensure_ascii=False))
    return 0


def remove_run(args: argparse.Namespace) -> int:
    with Store(args.db) as store:
        if not store.delete_run(args.run_id):
            raise CLIError(f"no run {args.run_id}")
    print(f"deleted {args.run_id}")
    return 0
