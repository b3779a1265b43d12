"""How well a reduced matmul precision keeps the default model's answers, against float32: greedy `ar` on the held-out
chat prompts in float32, int16 and int8 (the fused step) and bf16 (emulated in PyTorch where the CPU has no AMX
tiles: weights and each linear's input rounded to bfloat16, float32 sums; the AMX path's arithmetic up to summation
order).

For each precision: answers identical to float32's, the first-divergence position (an identical answer counts its
full length), token agreement (positions where the tokens equal float32's, over float32's length), the facts kept
(a fixed set of factual questions whose float32 answer holds the fact), and the model's-pick NLL: float32's mean
negative log-likelihood of the precision's answer tokens, against that of float32's own answers.

    python -m tools.precision_agreement [--prompts 36] [--max-new-tokens 64] [--threads 2] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from specscope.backend.engine.answer_fit import answer_fit
from specscope.backend.engine.cost_curve import FLAT
from specscope.backend.engine.engine import Engine
from specscope.backend.engine.lossless import first_difference
from specscope.backend.forward import fused_step
from specscope.backend.model.checkpoint import LoadedModel, load_checkpoint
from specscope.backend.model.source import resolve
from specscope.backend.model.transformer import LoRALinear
from specscope.backend.train.prompts import prompt_set

FACTS = (("What is the capital of Japan?", "Tokyo"), ("What is the capital of France?", "Paris"),
         ("Who wrote Romeo and Juliet?", "Shakespeare"), ("What is the capital of Italy?", "Rome"),
         ("What planet is known as the Red Planet?", "Mars"), ("What is the largest ocean on Earth?", "Pacific"),
         ("What is the chemical symbol for water?", "H2O"), ("How many days are in a week?", "seven"),
         ("What is the capital of Germany?", "Berlin"), ("Who painted the Mona Lisa?", "Leonardo"),
         ("What gas do plants take in from the air?", "carbon dioxide"),
         ("What is the boiling point of water in Celsius?", "100"))
"""Factual questions and the fact a right answer names (case-insensitive)."""


def load() -> LoadedModel:
    source = resolve(None)
    return load_checkpoint(source.folder, adapter=source.adapter, name=source.name)


def bf16_emulated(loaded: LoadedModel) -> LoadedModel:
    """The model with bf16 matmuls in PyTorch: every projection's and the head's weight and input rounded to
    bfloat16 (the embedding lookup stays float32, as on AMX)."""
    def rounded(x: torch.Tensor) -> torch.Tensor:
        return x.bfloat16().float()

    model = loaded.model
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoRALinear):
                module.weight.copy_(rounded(module.weight))
                module.register_forward_pre_hook(lambda _m, args: (rounded(args[0]), *args[1:]))
        head = rounded(model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight)
    model.logits = lambda h: torch.nn.functional.linear(rounded(model.norm(h)), head)  # type: ignore[method-assign]
    return loaded


def answers(engine: Engine, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
    return [engine.generate(p, "ar", {"max_new_tokens": max_new_tokens}).output_ids for p in prompts]


def agreement(reference: list[list[int]], other: list[list[int]]) -> dict[str, float]:
    """Identical answers, mean first-divergence position and positional token agreement against `reference`."""
    firsts = [first_difference(o, r) for r, o in zip(reference, other, strict=True)]
    same = sum(a == b for r, o in zip(reference, other, strict=True) for a, b in zip(r, o, strict=False))
    return {"identical": sum(f is None for f in firsts) / len(firsts),
            "first_divergence_mean": statistics.mean(len(r) if f is None else f
                                                     for r, f in zip(reference, firsts, strict=True)),
            "token_agreement": same / sum(len(r) for r in reference)}


def nll(judge: Engine, prompts: list[str], outputs: list[list[int]]) -> float:
    """float32's mean NLL a token of these answers."""
    fits = [answer_fit(judge, judge.encode_prompt(p, False), o) for p, o in zip(prompts, outputs, strict=True)]
    values = [x for f in fits for x in f.nll]
    return sum(values) / len(values)


def facts_kept(engine: Engine, reference: dict[str, bool] | None) -> dict[str, bool]:
    """Per fact question, whether this precision's answer names the fact."""
    return {q: fact.lower() in engine.generate(q, "ar", {"max_new_tokens": 40}).text.lower()
            for q, fact in FACTS if reference is None or reference[q]}


def timed(name: str, make: Callable[[], Engine]) -> Engine:
    t0 = time.perf_counter()
    engine = make()
    print(f"{name}: engine ready in {time.perf_counter() - t0:.1f} s", flush=True)
    return engine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=36)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    prompts = [r["messages"][0]["content"] for r in prompt_set(args.prompts, seed=0, held_out=True)]
    f32 = timed("float32", lambda: Engine(load(), num_slots=8192, cost_curve=FLAT))
    engines = {matmul: timed(matmul, lambda m=matmul: Engine(f32.rt.loaded, num_slots=8192, matmul=m,
                                                             cost_curve=FLAT))
               for matmul in ("int16", "int8")}
    fused_step.ENABLED = False      # the emulation runs on the eager backend
    engines["bf16 (emulated)"] = timed("bf16 (emulated)",
                                       lambda: Engine(bf16_emulated(load()), num_slots=8192, cost_curve=FLAT))
    reference = answers(f32, prompts, args.max_new_tokens)
    facts = facts_kept(f32, None)
    report = {"prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
              "float32": {"nll": nll(f32, prompts, reference), "facts": sum(facts.values()), "of_facts": len(FACTS)}}
    for name, engine in engines.items():
        outputs = answers(engine, prompts, args.max_new_tokens)
        kept = facts_kept(engine, facts)
        report[name] = {**agreement(reference, outputs), "nll": nll(f32, prompts, outputs),
                        "facts_kept": sum(kept.values()), "of_facts": len(kept),
                        "facts_lost": [q for q, ok in kept.items() if not ok]}
        print(name, json.dumps(report[name]), flush=True)
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
