"""`specscope compare`: several modes on one prompt, stored as a comparison, with each answer's equality to the
reference mode's and the model's rating of it."""
from __future__ import annotations

import argparse
import sys

from tqdm import tqdm

from specscope.backend.cli.common import CLIError, conversation, fmt, load_engine, parse_params, run_traced, table
from specscope.backend.cli.options import generation_options, model_options, store_options
from specscope.backend.engine.lossless import Outcome, claim_of, verdict
from specscope.backend.engine.messages import last_user
from specscope.backend.store import Store, StoreWriter

PARENTS = (generation_options, store_options, model_options)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--modes", default="", help="comma-separated (default: the modes that declare themselves "
                                               "Compare's defaults, Mode.picked)")
    p.add_argument("--reference", help="mode whose output the others are checked against (default: the first)")
    p.add_argument("--label")


def run(args: argparse.Namespace) -> int:
    from specscope.backend.bench_cells import pick_count
    from specscope.backend.engine.answer_fit import answer_fit
    from specscope.backend.engine.modes import get_mode, param_specs, picks
    modes = [m.strip() for m in args.modes.split(",") if m.strip()] or picks("compare")
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
        results, used = {}, {}
        for mode in tqdm(modes, desc="compare", unit="mode", file=sys.stderr):
            used[mode] = {k: v for k, v in params.items() if k in declared[mode]}
            results[mode] = run_traced(engine, writer, prompt, mode, used[mode])
        comparison_id = store.create_comparison(args.label or " vs ".join(modes),
                                                prompt if isinstance(prompt, str) else last_user(prompt),
                                                [r.run_id for r in results.values()])
    outcomes = {mode: Outcome(mode, r.output_ids, used[mode], r.status) for mode, r in results.items()}
    prompt_ids = engine.encode_prompt(prompt, bool(params.get("raw")))
    fits = {mode: answer_fit(engine, prompt_ids, r.output_ids) for mode, r in results.items()}
    rows = [[mode, r.metrics["nfe"], fmt(r.metrics["tpf"]), fmt(r.metrics["tok_per_s"], ".1f"),
             fmt(r.metrics["accept_len_mean"]), r.metrics["kv_peak"],
             "(ref)" if mode == reference else ("yes" if r.output_ids == results[reference].output_ids else "no"),
             claim_cell(outcomes, mode), pick_count(fits[mode].summary()), r.status, r.run_id]
            for mode, r in results.items()]
    print(table(["mode", "NFE", "TPF", "tok/s", "mean acc", "KV peak", f"same as {reference}", "lossless claim",
                 "model's pick (NLL)", "status", "run"], rows))
    print(f"comparison {comparison_id}")
    return 0


def claim_cell(outcomes: dict[str, Outcome], mode: str) -> str:
    """The mode's own lossless claim on this prompt: 'holds', 'FAILS (first 3 of 32 tokens as ar)', why it could
    not be checked, or '-' where the mode claims nothing or its reference did not run."""
    claim = claim_of(mode)
    if claim is None or claim.reference not in outcomes:
        return "-"
    found = verdict(outcomes[mode], outcomes[claim.reference], claim)
    if not found.checked:
        return "not checked (" + ", ".join(found.blockers) + ")"
    return "holds" if found.identical else f"FAILS ({found.agreement()})"
