"""`specscope run`: one traced generation, its text streamed to the terminal and the run stored."""
from __future__ import annotations

import argparse
from contextlib import nullcontext

from specscope.backend.cli.common import Event, conversation, load_engine, metrics_line, parse_params, run_traced
from specscope.backend.cli.options import generation_options, model_options, store_options
from specscope.backend.store import Store, StoreWriter

PARENTS = (generation_options, store_options, model_options)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", required=True)
    p.add_argument("--no-store", action="store_true")


def run(args: argparse.Namespace) -> int:
    prompt = conversation(args)
    params = parse_params(args.param, args.max_new_tokens)
    engine = load_engine(args)
    store = None if args.no_store else Store(args.db)

    def show(event: Event) -> None:
        if event["type"] == "round" and event["text_delta"]:
            print(event["text_delta"], end="", flush=True)

    try:
        with StoreWriter(store) if store else nullcontext() as writer:
            res = run_traced(engine, writer, prompt, args.mode, params, show)
    finally:
        if store:
            store.close()
    print()
    print(metrics_line(res))
    print(f"run {res.run_id}" + (f" stored in {args.db}" if store else " (not stored)"))
    return 0 if res.status == "done" else 1
