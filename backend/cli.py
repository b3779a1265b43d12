"""The `specscope` command: serve, run, compare, export, runs, bench, calibrate.

Heavy imports (torch, the model, FastAPI) happen inside the subcommands that need them, so `specscope runs ls`
and `--help` stay quick.
"""
from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import re
import socket
import sys
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from backend.engine.messages import Prompt, check_messages, last_user
from backend.engine.params import ParamError
from backend.store import LEASE_TIMEOUT_S, Store, StoreError, StoreWriter, Tee, export_json, export_perfetto
from backend.store.db import DEFAULT_URL

if TYPE_CHECKING:
    from backend.engine.engine import Engine, RunResult
    from backend.server.app import UIMount

Event = dict[str, Any]
NUMBER = re.compile(r"^(-?\d+(\.\d+)?|-)$")


class CLIError(Exception):
    """A user error: printed as `specscope: error: ...`, exit status 2."""


# -- shared helpers --------------------------------------------------------------------------------------------------

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
    given, at most what the scheduler can hold), block-size tiers and intra-op threads. Raises ParamError or
    CheckpointError."""
    import torch

    from backend.engine.engine import Engine
    from backend.engine.scheduler import MAX_RUNNING, parse_tiers
    from backend.model.options import load_from_args
    if args.threads:
        torch.set_num_threads(args.threads)
    tiers = parse_tiers(args.block_size_tiers) if args.block_size_tiers else None
    loaded, slots = load_from_args(args, at_most_per_sequence=MAX_RUNNING)
    return Engine(loaded, num_slots=slots, tiers=tiers, matmul=args.matmul)


def load_engine(args: argparse.Namespace) -> Engine:
    """build_engine, its errors as CLIError."""
    from backend.forward.fused_step import MatmulUnavailable
    from backend.model.config import CheckpointError
    try:
        return build_engine(args)
    except (ParamError, CheckpointError, MatmulUnavailable) as e:
        raise CLIError(str(e)) from None


def folder_options(args: argparse.Namespace, folder: str | Path) -> argparse.Namespace:
    """The same model options for another model, a name or a checkpoint folder (its own shipped adapter, unless
    --adapter none)."""
    return argparse.Namespace(**{**vars(args), "model": str(folder),
                                 "adapter": "none" if args.adapter == "none" else None})


def first_model(models_dir: str) -> str | None:
    """The first loadable folder of a models directory, or None."""
    from backend.model.catalog import scan
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


# -- subcommands -----------------------------------------------------------------------------------------------------

def serve_build(args: argparse.Namespace, folder: str | Path | None) -> Engine:
    """The engine process's builder: the model options for `folder` (the started model when None)."""
    return build_engine(args if folder is None else folder_options(args, folder))


def installed_ui() -> UIMount | None:
    """The Gradio UI's mount (app/ui.py), or None where it is not installed (no app package or no Gradio): the
    CLI composes the server and the UI, so the server never imports upward."""
    try:
        from app.ui import mount_ui
    except ImportError:
        return None
    return mount_ui


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from backend.model.config import CheckpointError
    from backend.server import BindError, check_bind, create_app
    from backend.server.engine_process import EngineProcess
    from backend.server.protocol import MAX_MESSAGE_BYTES, MAX_QUEUED_RUNS
    try:
        check_bind(args.host, args.token)
    except BindError as e:
        raise CLIError(str(e)) from None
    if args.token:
        os.environ["SPECSCOPE_TOKEN"] = args.token  # the mounted UI reaches this server with it
    if args.models and not Path(args.models).is_dir():
        raise CLIError(f"--models {args.models}: no such directory")
    if args.models and not args.model:
        args.model = first_model(args.models)
    engine = EngineProcess(functools.partial(serve_build, args), max_queued=args.max_queued or MAX_QUEUED_RUNS)
    try:
        engine.start()
    except (ParamError, CheckpointError) as e:
        raise CLIError(str(e)) from None
    try:
        store = Store(args.db, server=f"{socket.gethostname()}:{args.port}")
        app = create_app(engine, store, token=args.token, ui=None if args.no_ui else installed_ui(),
                         backend_url=args.backend or f"ws://127.0.0.1:{args.port}", models_dir=args.models,
                         lease_timeout_s=args.lease_timeout)
        try:
            uvicorn.run(app, host=args.host, port=args.port, ws_max_size=4 * MAX_MESSAGE_BYTES,
                        ws_per_message_deflate=False)  # small JSON events: compressing each cost the engine time
        finally:
            store.close()
    finally:
        engine.stop()
    return 0


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


def cmd_run(args: argparse.Namespace) -> int:
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


def cmd_compare(args: argparse.Namespace) -> int:
    from backend.answer_fit import answer_fit
    from backend.bench_cells import pick_count
    from backend.engine.modes import get_mode, param_specs
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes:
        raise CLIError("--modes names no mode")
    declared = {m: {p.name for p in param_specs(get_mode(m))} for m in modes}
    params = parse_params(args.param, args.max_new_tokens)
    unused = sorted(set(params) - set().union(*declared.values()))
    if unused:
        raise CLIError(f"no mode among {modes} takes parameter(s) {unused}")
    prompt = conversation(args)
    reference = args.reference or modes[0]
    if reference not in modes:
        raise CLIError(f"--reference {reference} is not among --modes")

    engine = load_engine(args)
    with Store(args.db) as store, StoreWriter(store) as writer:
        results = {}
        for mode in tqdm(modes, desc="compare", unit="mode", file=sys.stderr):
            mode_params = {k: v for k, v in params.items() if k in declared[mode]}
            results[mode] = run_traced(engine, writer, prompt, mode, mode_params)
        comparison_id = store.create_comparison(args.label or " vs ".join(modes),
                                                prompt if isinstance(prompt, str) else last_user(prompt),
                                                [r.run_id for r in results.values()])
    ref_ids = results[reference].output_ids
    prompt_ids = engine.encode_prompt(prompt, bool(params.get("raw")))
    fits = {mode: answer_fit(engine, prompt_ids, r.output_ids) for mode, r in results.items()}
    rows = [[mode, r.metrics["nfe"], fmt(r.metrics["tpf"]), fmt(r.metrics["tok_per_s"], ".1f"),
             fmt(r.metrics["accept_len_mean"]), r.metrics["kv_peak"],
             "(ref)" if mode == reference else ("yes" if r.output_ids == ref_ids else "no"),
             pick_count(fits[mode].summary()), r.status, r.run_id]
            for mode, r in results.items()]
    print(table(["mode", "NFE", "TPF", "tok/s", "mean acc", "KV peak", f"same as {reference}", "model's pick (NLL)",
                 "status", "run"], rows))
    print(f"comparison {comparison_id}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    with Store(args.db) as store:
        doc = (export_json if args.format == "json" else export_perfetto)(store, args.run_id)
    text = json.dumps(doc, allow_nan=False, separators=(",", ":"))
    if args.output == "-":
        print(text)
    else:
        Path(args.output).write_text(text + "\n")
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


def cmd_runs_ls(args: argparse.Namespace) -> int:
    with Store(args.db) as store:
        runs = store.list_runs(args.mode, args.status, args.limit)
    rows = [[r["run_id"], r["created_at"][:19], r["mode"], r["status"], r["n_tokens"], r["n_rounds"],
             r["server"] or "-", r["prompt"][:40].replace("\n", " ")] for r in runs]
    print(table(["run", "created (UTC)", "mode", "status", "tokens", "rounds", "server", "prompt"], rows))
    return 0


def cmd_runs_show(args: argparse.Namespace) -> int:
    with Store(args.db) as store:
        run = store.get_run(args.run_id)
    if run is None:
        raise CLIError(f"no run {args.run_id}")
    print(json.dumps(run, indent=2, ensure_ascii=False))
    return 0


def cmd_runs_rm(args: argparse.Namespace) -> int:
    with Store(args.db) as store:
        if not store.delete_run(args.run_id):
            raise CLIError(f"no run {args.run_id}")
    print(f"deleted {args.run_id}")
    return 0


# -- parser ----------------------------------------------------------------------------------------------------------

# Subcommands owned by other modules: each has add_arguments(parser) and run(args), imported only when used.
DELEGATED = {"bench": ("backend.bench", "benchmark the modes on held-out prompts"),
             "calibrate": ("backend.calibrate", "calibrate the spiffy / specfold draft graph")}


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    from backend.model.options import add_model_args

    """The parser, and the subparsers of DELEGATED commands (still without their arguments)."""
    db = argparse.ArgumentParser(add_help=False)
    db.add_argument("--db", default=DEFAULT_URL, help=f"SQLAlchemy URL of the store (default {DEFAULT_URL})")
    model = argparse.ArgumentParser(add_help=False)
    add_model_args(model)
    model.add_argument("--block-size-tiers", metavar="N:B,...",
                       help="block size by running requests, SGLang-style, e.g. 1:32,4:16,64:8 (a catch-all tier "
                            "covering 64 running requests is required)")
    model.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's own)")
    gen = argparse.ArgumentParser(add_help=False)
    gen.add_argument("prompt", nargs="?", help="the user's message (or, with --param raw=true, the raw text)")
    gen.add_argument("--messages", metavar="JSON|FILE|-",
                     help="a conversation instead of a prompt: a JSON list of {role, content} (system / user / "
                          "assistant, ending with user), inline, in a file, or '-' for stdin")
    gen.add_argument("--system", help="a system message put before the prompt (or the --messages)")
    gen.add_argument("--param", action="append", default=[], metavar="K=V", help="decoding parameter (repeatable)")
    gen.add_argument("--max-new-tokens", type=int)

    parser = argparse.ArgumentParser(prog="specscope", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", parents=[db, model], help="serve the UI, REST and websockets")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--token", default=os.environ.get("SPECSCOPE_TOKEN"),
                   help="bearer token required by every request (default $SPECSCOPE_TOKEN)")
    p.add_argument("--no-ui", action="store_true", help="do not mount the Gradio UI")
    p.add_argument("--backend", help="websocket URL the UI talks to (default ws://127.0.0.1:PORT)")
    p.add_argument("--models", metavar="DIR", help="a folder of checkpoint folders: the UI and /api/models switch "
                                                   "between them (default served model: --model, else DIR's first "
                                                   "loadable folder)")
    p.add_argument("--max-queued", type=int, help="runs queued or running at once before new ones get a busy "
                                                  "error (default: MAX_QUEUED_RUNS in backend/server/protocol.py)")
    p.add_argument("--lease-timeout", type=float, default=LEASE_TIMEOUT_S, metavar="S",
                   help="this server renews a lease in the store every S/5 seconds; the running runs of a server "
                        "whose lease is older than S seconds are marked interrupted (default %(default)s)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("run", parents=[gen, db, model], help="generate once, streaming text; store the run")
    p.add_argument("--mode", required=True)
    p.add_argument("--no-store", action="store_true")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("compare", parents=[gen, db, model], help="run several modes on one prompt")
    p.add_argument("--modes", default="ar,block_diffusion,linear_spec", help="comma-separated")
    p.add_argument("--reference", help="mode whose output the others are checked against (default: the first)")
    p.add_argument("--label")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("export", parents=[db], help="write a stored run as JSON or a Perfetto trace")
    p.add_argument("run_id")
    p.add_argument("--format", choices=("json", "perfetto"), default="json")
    p.add_argument("-o", "--output", default="-", help="file (default: stdout)")
    p.set_defaults(func=cmd_export)

    runs = sub.add_parser("runs", help="list, show or delete stored runs").add_subparsers(dest="runs_command",
                                                                                          required=True)
    p = runs.add_parser("ls", parents=[db])
    p.add_argument("--mode")
    p.add_argument("--status")
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(func=cmd_runs_ls)
    for name, func in (("show", cmd_runs_show), ("rm", cmd_runs_rm)):
        p = runs.add_parser(name, parents=[db])
        p.add_argument("run_id")
        p.set_defaults(func=func)

    delegated = {name: sub.add_parser(name, add_help=False, help=f"{help} ({module})")
                 for name, (module, help) in DELEGATED.items()}
    return parser, delegated


def run_delegated(parser: argparse.ArgumentParser, sub: argparse.ArgumentParser, command: str,
                  argv: Sequence[str] | None) -> int:
    try:
        module = importlib.import_module(DELEGATED[command][0])
    except ImportError as e:
        raise CLIError(f"{command} is not available: {e}") from None
    sub.add_argument("-h", "--help", action="help", help="show this help message and exit")
    module.add_arguments(sub)
    module.run(parser.parse_args(argv))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from backend.model.config import CheckpointError

    parser, delegated = build_parser()
    args, extra = parser.parse_known_args(argv)
    try:
        if args.command in delegated:
            return run_delegated(parser, delegated[args.command], args.command, argv)
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return args.func(args)
    except (CLIError, ParamError, CheckpointError, StoreError) as e:
        print(f"specscope: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
