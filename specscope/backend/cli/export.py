"""`specscope export`: a stored run as JSON, or as a Perfetto trace."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specscope.backend.cli.options import store_options
from specscope.backend.store import Store, export_json, export_perfetto

PARENTS = (store_options,)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_id")
    p.add_argument("--format", choices=("json", "perfetto"), default="json")
    p.add_argument("-o", "--output", default="-", help="file (default: stdout)")


def run(args: argparse.Namespace) -> int:
    with Store(args.db) as store:
        doc = (export_json if args.format == "json" else export_perfetto)(store, args.run_id)
    text = json.dumps(doc, allow_nan=False, separators=(",", ":"))
    if args.output == "-":
        print(text)
    else:
        Path(args.output).write_text(text + "\n")
        print(f"wrote {args.output}", file=sys.stderr)
    return 0
