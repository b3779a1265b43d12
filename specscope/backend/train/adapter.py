"""Train the self-speculation adapter: a LoRA on every projection, on at MASK positions only (the gated LoRA of
"Your LLM Knows the Future"; I-DLM's R-ISD scope), plus the MASK token's embedding, on the base model's own
greedy answers in every mode's draft layout (train/layouts.py). Ordinary tokens never see the adapter, so
the model's next-token outputs, and every lossless claim, stay exact. `--scope draft` trains the other scope
instead (Nemotron's linear-spec LoRA: on for whole draft forwards, which only linear_spec and the block modes
have), to compare the two on the modes that can use either. The command line: `specscope train adapter`.

Resumable: <workdir>/state.pt holds the adapter, the optimizer and the step, saved every --save-every steps;
each step's batch is a pure function of (seed, step). Losses go to <workdir>/curves.jsonl and held-out figures
to <workdir>/heldout.jsonl; --export writes the PEFT folder whenever the held-out figures improve. The same
command runs on CUDA when a GPU is present.

`--head` trains a sampler head (backend/model/sampler_head.py) together with the adapter, as the paper does: the
head's chain loss on the batch's causal and block MASK rows (train/head.py's, teacher-forced) joins the
objective, its gradient reaches the adapter through the rows' hidden states, the held-out figures are the
chain's, and exports write the head beside the adapter.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specscope.backend.model.adapters import save_adapter
from specscope.backend.model.checkpoint import ADAPTER_META, load_model
from specscope.backend.model.sampler_head import SamplerHead, load_sampler, save_sampler
from specscope.backend.model.source import resolve
from specscope.backend.model.transformer import LoRALinear, PagedKV, Transformer, normed_hidden
from specscope.backend.train.answers import read_rows
from specscope.backend.train.head import chain_figures, chain_loss
from specscope.backend.train.heldout import heldout_figures
from specscope.backend.train.layouts import IGNORE, KINDS, Chunk, Mix, chunks_for
from specscope.backend.train.packing import Packed, chunk_logits, pack


class MaskRow(nn.Module):
    """The token embedding with the MASK row trainable (a copy; the base table stays frozen)."""

    def __init__(self, base: nn.Embedding, mask_id: int):
        super().__init__()
        self.base = base
        self.mask_id = mask_id
        self.row = nn.Parameter(base.weight[mask_id].detach().clone())

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight     # the tied LM head: MASK is never picked, so its logit row is left as it is

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.where((ids == self.mask_id)[..., None], self.row.to(self.base.weight.dtype), self.base(ids))


def prepare_model(folder: Path, rank: int, alpha: float, device: str,
                  init: Path | None = None) -> tuple[Transformer, MaskRow]:
    """The base model with a fresh LoRA (rank, alpha), or with the adapter folder `init` to train further."""
    model = load_model(folder, torch.float32, device, adapter=init or False)
    if init is None:
        for module in model.modules():
            if isinstance(module, LoRALinear):
                module.add_adapter(rank, alpha)
    model.requires_grad_(False)
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.requires_grad_(True)
    mask_id = model.cfg.mask_token_id
    if mask_id is None:
        raise SystemExit(f"{folder}: the model declares no mask_token_id")
    embed = MaskRow(model.embed_tokens, mask_id)
    model.embed_tokens = embed   # type: ignore[assignment]
    return model, embed


def trainable(model: Transformer) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def draw_batch(rows: list[dict], step: int, seed: int, size: int, mask_id: int,
               mix: Mix) -> tuple[list[list[int]], list[list[Chunk]]]:
    """Step `step`'s sequences and their draft layouts: a pure function of (seed, step)."""
    rng = random.Random(seed * 1_000_003 + step)
    picked = rng.sample(rows, size)
    return [r["seq"] for r in picked], [chunks_for(r["seq"], r["prompt_len"], mask_id, mix, rng) for r in picked]


def losses(model: Transformer, p: Packed, device: str, kv_dtype: torch.dtype = torch.float32,
           scope: str = "mask") -> dict[str, torch.Tensor]:
    """Mean cross-entropy per layout kind over its trained rows."""
    p = p.to(device)
    b, width = p.clean_ids.shape
    logits = chunk_logits(model, p, PagedKV.empty(model.cfg, b * width, kv_dtype, device), scope)
    kind_of = p.kind_index()
    out = {}
    for k, name in enumerate(KINDS):
        sel = (kind_of == k) & (p.targets != IGNORE)
        if sel.any():
            out[name] = F.cross_entropy(logits[sel].float(), p.targets[sel])
    return out


def mix_for(weights: dict[str, float], scale: int = 1) -> Mix:
    """The default layout mix with `scale` times its chunks a sequence (more drafts trained for each clean pass),
    without the kinds weighted 0 (their chunks would cost a forward for nothing)."""
    counts = {kind: 0 if weights[kind] == 0 else getattr(Mix(), kind) * scale for kind in KINDS}
    return Mix(**counts)


def score(figures: dict[str, float], weights: dict[str, float]) -> float:
    """What an export must improve: the held-out figures of the trained layout kinds (the chain's, when a sampler
    head trains along)."""
    chain = "chain_" if "chain_block8" in figures else ""
    return figures[f"{chain}block8"] + (figures[f"{chain}causal4"] if weights["causal"] > 0 else 0.0)


def lr_at(step: int, steps: int, peak: float, warmup: int = 20) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, steps - warmup)))))


def export(model: Transformer, embed: MaskRow, head: SamplerHead | None, folder: Path, figures: dict,
           args: argparse.Namespace) -> None:
    save_adapter(model, folder, base_model="HuggingFaceTB/SmolLM2-135M-Instruct",
                 tokens={"embed_tokens": {embed.mask_id: embed.row.detach()}})
    if head is not None:
        save_sampler(head, folder)
    (folder / ADAPTER_META).write_text(json.dumps({"adapter_scope": args.scope}))
    recipe = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    (folder / "training.json").write_text(json.dumps({"recipe": recipe, "heldout": figures}, indent=1))


def record_heldout(model: Transformer, head: SamplerHead | None, held: list[dict], mask_id: int,
                   args: argparse.Namespace, step: int) -> dict[str, float]:
    """The held-out figures at this step (the rows', and the head's chain when one trains along), appended to
    <workdir>/heldout.jsonl and printed."""
    if head is None:
        figures = heldout_figures(model, held, mask_id, args.device, args.eval_sequences, scope=args.scope)
    else:
        figures = chain_figures(model, head.eval(), held, mask_id, args.device, args.eval_sequences)
        head.train()
    with (args.workdir / "heldout.jsonl").open("a") as f:
        f.write(json.dumps({"step": step, **figures}) + "\n")
    print("heldout", json.dumps(figures), flush=True)
    return figures


def train(args: argparse.Namespace) -> None:
    """The training run the command line's options describe: resumed from <workdir>/state.pt when there is one."""
    torch.manual_seed(args.seed)
    folder = resolve(args.model).folder
    model, embed = prepare_model(folder, args.rank, args.alpha, args.device, args.init_adapter)
    pad_id = model.cfg.eos_token_id or 0
    head = load_sampler(args.head, args.device).requires_grad_(True).train() if args.head else None
    params = trainable(model)
    groups = [{"params": params, "lr_scale": 1.0}]
    if head is not None:
        groups.append({"params": list(head.parameters()), "lr_scale": args.head_lr / args.lr})
        params = params + groups[1]["params"]
    opt = torch.optim.AdamW(groups, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.99))
    rows, held = read_rows(args.data, args.max_len, pad_id), read_rows(args.heldout, args.max_len, pad_id)
    args.workdir.mkdir(parents=True, exist_ok=True)
    state_path, step, best = args.workdir / "state.pt", 0, -1.0
    if state_path.exists():
        state = torch.load(state_path, map_location=args.device)
        for prm, saved in zip(params, state["params"], strict=True):
            prm.data.copy_(saved)
        opt.load_state_dict(state["opt"])
        step, best = state["step"], state["best"]
        print(f"resumed at step {step} (best held-out {best:.3f})", flush=True)
    print(f"{len(rows)} training sequences, {len(held)} held out; {sum(x.numel() for x in params)} trainable",
          flush=True)
    mix = mix_for(args.kind_weights, args.chunk_scale)
    if step == 0:    # the starting adapter's figures; an --init-adapter's are what an export must beat
        figures = record_heldout(model, head, held, embed.mask_id, args, 0)
        if args.init_adapter:
            best = score(figures, args.kind_weights)
    model.train()
    t0 = time.perf_counter()
    while step < args.steps:
        seqs, chunks = draw_batch(rows, step, args.seed, args.batch, embed.mask_id, mix)
        batch = pack(seqs, chunks, embed.mask_id, pad_id)
        with (torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16, enabled=args.bf16),
              normed_hidden(model) as hidden):
            parts = losses(model, batch, args.device, torch.bfloat16 if args.bf16 else torch.float32, args.scope)
            if head is not None:
                parts["chain"] = chain_loss(head, embed.weight, hidden[-1], batch, chunks, embed.mask_id,
                                            args.head_rows, torch.Generator().manual_seed(args.seed + step))
        weights = [{**args.kind_weights, "chain": args.head_weight}[k] for k in parts]
        loss = sum(w * v for w, v in zip(weights, parts.values(), strict=True)) / sum(weights)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr) * group["lr_scale"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        row = {"step": step, "loss": round(loss.detach().item(), 4),
               **{k: round(v.detach().item(), 4) for k, v in parts.items()},
               "rows": int((batch.targets != IGNORE).sum()), "s": round(time.perf_counter() - t0, 1)}
        with (args.workdir / "curves.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            figures = record_heldout(model, head, held, embed.mask_id, args, step)
            now = score(figures, args.kind_weights)
            if now > best:
                best = now
                if args.export:
                    export(model, embed, head, args.export, {"step": step, **figures}, args)
                    print(f"exported to {args.export}", flush=True)
        if step % args.save_every == 0 or step == args.steps:
            tmp = state_path.with_suffix(".tmp")
            torch.save({"params": [x.detach() for x in params], "opt": opt.state_dict(), "step": step,
                        "best": best}, tmp)
            tmp.replace(state_path)
