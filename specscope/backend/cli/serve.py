"""`specscope serve`: the engine in its own process, the REST and websocket server, and the UI."""
from __future__ import annotations

import argparse
import functools
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from specscope.backend.cli.common import CLIError, build_engine, first_model, folder_options, show_steps
from specscope.backend.cli.options import model_options, store_options
from specscope.backend.engine.params import ParamError
from specscope.backend.store import LEASE_TIMEOUT_S, Store

if TYPE_CHECKING:
    from specscope.backend.engine.engine import Engine
    from specscope.backend.server.app import UIMount
    from specscope.backend.server.service import EngineService

PARENTS = (store_options, model_options)

def add_arguments(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="serve engine replicas on Ray: join the cluster at ADDRESS, or with no address start one "
                        "on this machine (needs the ray extra: pip install 'specscope[ray]')")
    p.add_argument("--replicas", type=int, default=1, help="with --ray: engine replicas, one Ray actor each")
    p.add_argument("--replica-cpus", type=float, default=1.0,
                   help="with --ray: CPUs each replica reserves on the cluster (and its torch threads)")
    p.set_defaults(draft_tiers="auto")
    p.add_argument("--lease-timeout", type=float, default=LEASE_TIMEOUT_S, metavar="S",
                   help="this server renews a lease in the store every S/5 seconds; the running runs of a server "
                        "whose lease is older than S seconds are marked interrupted (default %(default)s)")



def serve_build(args: argparse.Namespace, folder: str | Path | None) -> Engine:
    """The engine process's builder: the model options for `folder` (the started model when None). Its steps
    (the cost curve's) are logged to the server's stderr."""
    show_steps()
    return build_engine(args if folder is None else folder_options(args, folder))


def installed_ui() -> UIMount | None:
    """The Gradio UI's mount (app/ui.py), or None where it is not installed (no app package or no Gradio): the
    CLI composes the server and the UI, so the server never imports upward."""
    try:
        from specscope.app.ui import mount_ui
    except ImportError:
        return None
    return mount_ui


def engine_service(args: argparse.Namespace, max_queued: int) -> EngineService:
    """The engine in a process of its own, or with --ray, engine replicas on a Ray cluster."""
    build = functools.partial(serve_build, args)
    if args.ray is None:
        from specscope.backend.server.engine_process import EngineProcess
        return EngineProcess(build, max_queued=max_queued)
    if args.replicas < 1:
        raise CLIError(f"--replicas {args.replicas}: serve at least one replica")
    try:
        from specscope.backend.server.ray_replicas import Replicas
    except ImportError:
        raise CLIError("--ray needs Ray: pip install 'specscope[ray]'") from None
    return Replicas(build, args.replicas, max_queued, address=None if args.ray == "local" else args.ray,
                    cpus=args.replica_cpus)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from specscope.backend.model.config import CheckpointError
    from specscope.backend.server import BindError, check_bind, create_app
    from specscope.backend.server.protocol import MAX_MESSAGE_BYTES, MAX_QUEUED_RUNS
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
    engine = engine_service(args, args.max_queued or MAX_QUEUED_RUNS)
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
