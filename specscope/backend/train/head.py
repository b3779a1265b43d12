"""Train the sampler head (backend/model/sampler_head.py) on a frozen model + adapter: the MASK rows of the
causal and block draft layouts (train/layouts.py), each row's normed hidden state with the token before its
target (teacher-forced: a chain's draft only counts while every draft before it was right, so the previous
token is then the true one). The rows' features are extracted once (one forward a batch, no grad), then the
head trains on them for epochs; the held-out figures (every --eval-every steps) are the chain's real ones (only the
rows' top candidates ranked), against the rows alone. The command line: `specscope train head`.

Resumable: <workdir>/features.pt holds the extracted rows (and grows with --data: answers appended since are
extracted on the next start), <workdir>/state.pt the head, its optimizer and the
step (saved at every evaluation); figures go to <workdir>/heldout.jsonl. --export writes the head into the adapter
folder whenever the held-out figures improve. The same command runs on CUDA.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time

import torch
import torch.nn.functional as F
from torch import Tensor

from specscope.backend.model.checkpoint import load_model
from specscope.backend.model.sampler_head import SamplerHead, save_sampler
from specscope.backend.model.source import resolve
from specscope.backend.model.transformer import PagedKV, Transformer, normed_hidden
from specscope.backend.train.answers import read_rows
from specscope.backend.train.heldout import LAYOUTS, add_rounds, layout_chunks
from specscope.backend.train.layouts import IGNORE, KINDS, Chunk, Mix, chunks_for
from specscope.backend.train.packing import Packed, chunk_logits, pack

CHAIN_MIX = Mix(block=12, block_sizes=(4, 8, 16), causal=16, causal_masks=(3, 4, 6), partial=0)
"""The layouts whose MASK rows draft a chain (isd, quadratic, linear_spec); the partial blocks unmask in
parallel, by confidence, and have no chain."""


def hidden_and_logits(model: Transformer, seqs: list[list[int]], chunks: list[list[Chunk]], mask_id: int,
                      pad_id: int, device: str) -> tuple[Tensor, Tensor, Packed]:
    """The chunk rows' normed hidden states [B, Q, D] and logits [B, Q, V] of one packed forward (adapter on at
    MASK rows), and the packed batch (on the CPU)."""
    p = pack(seqs, chunks, mask_id, pad_id)
    b, width = p.clean_ids.shape
    with normed_hidden(model) as seen, torch.no_grad():
        logits = chunk_logits(model, p.to(device), PagedKV.empty(model.cfg, b * width, torch.float32, device))
    return seen[-1], logits, p


def mask_rows(ids: Tensor, targets: Tensor, mask_id: int) -> Tensor:
    """The trained rows: MASK rows with a target."""
    return (ids == mask_id) & (targets != IGNORE)


def previous_tokens(chunks: list[list[Chunk]], q: int) -> Tensor:
    """For every chunk row, the true token at its own position (the one its target follows) [B, Q]."""
    prev = torch.zeros(len(chunks), q, dtype=torch.long)
    for i, cs in enumerate(chunks):
        row = 0
        for c in cs:
            known = [c.ids[0]] + c.targets[:-1]          # row r's own token is row r-1's target
            prev[i, row:row + len(c.ids)] = torch.tensor([t if t != IGNORE else 0 for t in known])
            row += len(c.ids)
    return prev


def extract(model: Transformer, rows: list[dict], mask_id: int, pad_id: int, device: str, seed: int,
            batch: int = 8) -> dict[str, Tensor]:
    """One pass over the sequences: every trained row's hidden state (bf16), previous token and target."""
    rng = random.Random(seed)
    hidden, prev, target = [], [], []
    t0 = time.perf_counter()
    for start in range(0, len(rows), batch):
        group = rows[start:start + batch]
        chunks = [chunks_for(r["seq"], r["prompt_len"], mask_id, CHAIN_MIX, rng) for r in group]
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            h, _, p = hidden_and_logits(model, [r["seq"] for r in group], chunks, mask_id, pad_id, device)
        sel = mask_rows(p.ids, p.targets, mask_id)
        hidden.append(h[sel.to(h.device)].to(torch.bfloat16).cpu())
        prev.append(previous_tokens(chunks, p.ids.shape[1])[sel])
        target.append(p.targets[sel])
        if start // batch % 50 == 0:
            print(f"extracted {start + len(group)}/{len(rows)} sequences, {time.perf_counter() - t0:.0f} s",
                  flush=True)
    return {"hidden": torch.cat(hidden), "prev": torch.cat(prev), "target": torch.cat(target)}


def features(model: Transformer, args: argparse.Namespace, mask_id: int, pad_id: int) -> dict[str, Tensor | int]:
    """<workdir>/features.pt, brought up to date: the answers appended to --data since it was written (the
    generator only appends) are extracted, --passes times each, and added to it."""
    path = args.workdir / "features.pt"
    data: dict = torch.load(path) if path.exists() else {"sequences": 0}
    done = data["sequences"]
    rows = read_rows(args.data, args.max_len, pad_id)[done:]
    if not rows:
        return data
    passes = [extract(model, rows, mask_id, pad_id, args.device, args.seed + done + k) for k in range(args.passes)]
    new = {key: torch.cat([p[key] for p in passes]) for key in passes[0]}
    data = {**{key: torch.cat([data[key], rows_]) if key in data else rows_ for key, rows_ in new.items()},
            "sequences": done + len(rows)}
    torch.save(data, path)
    return data


def chain_figures(model: Transformer, head: SamplerHead, rows: list[dict], mask_id: int, device: str,
                  sequences: int = 32, stride: int = 9) -> dict[str, float]:
    """Held-out tokens per round (train/heldout.py's count) of heldout.LAYOUTS' drafts, by the rows alone
    (`rows_*`) and by the head's chain (`chain_*`)."""
    weight = model.embed_tokens.weight
    totals: dict[str, list[int]] = {}
    pad = model.cfg.eos_token_id or 0
    for start in range(0, min(sequences, len(rows)), 4):
        group = rows[start:start + 4]
        for kind, n in LAYOUTS:
            chunks = layout_chunks(group, kind, n, mask_id, stride)
            hidden, logits, p = hidden_and_logits(model, [r["seq"] for r in group], chunks, mask_id, pad, device)
            logits[..., mask_id] = float("-inf")
            prev = previous_tokens(chunks, p.ids.shape[1]).to(device)
            with torch.no_grad():
                chained = head.rescore(logits, hidden, weight[prev], weight)
            chained = torch.where((p.ids.to(device) == mask_id)[..., None], chained, logits)
            for name, scores in (("rows", logits), ("chain", chained)):
                add_rounds(totals.setdefault(f"{name}_{kind}{n}", [0, 0]), scores.argmax(-1).cpu(), p, kind)
    return {k: round(s / max(c, 1), 3) for k, (s, c) in sorted(totals.items())}


def train_sampler(args: argparse.Namespace) -> None:
    """The run the command line describes: features extracted (or read back), then epochs over them, evaluated
    every --eval-every steps."""
    torch.manual_seed(args.seed)
    model = load_model(resolve(args.model).folder, torch.float32, args.device, adapter=args.adapter)
    mask_id, pad_id = model.cfg.mask_token_id, model.cfg.eos_token_id or 0
    if mask_id is None:
        raise SystemExit("the model declares no mask_token_id")
    args.workdir.mkdir(parents=True, exist_ok=True)
    held = read_rows(args.heldout, args.max_len, pad_id)
    data = features(model, args, mask_id, pad_id)
    print(f"{len(data['target'])} training rows from {data['sequences']} answers", flush=True)
    head = SamplerHead(model.cfg.hidden_size, args.width, args.candidates, args.dropout).to(args.device)
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.0)
    state_path, step, best = args.workdir / "state.pt", 0, -1.0
    if state_path.exists():
        state = torch.load(state_path, map_location=args.device)
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["opt"])
        step, best = state["step"], state["best"]
        print(f"resumed at step {step} (best {best:.3f})", flush=True)
    total = len(data["target"])
    per_epoch = total // args.batch
    steps = args.epochs * per_epoch
    t0, running, order = time.perf_counter(), 0.0, torch.empty(0)
    while step < steps:
        epoch, index = divmod(step, per_epoch)
        if index == 0 or not len(order):     # each epoch's row order, drawn once (and again on resuming)
            order = torch.randperm(total, generator=torch.Generator().manual_seed(args.seed + epoch))
        loss = sampler_step(model, head, opt, data, order[index * args.batch:(index + 1) * args.batch],
                            args.lr * 0.5 * (1 + math.cos(math.pi * step / steps)), args)
        step += 1
        running += loss
        if step % 100 == 0:
            print(json.dumps({"step": step, "epoch": round(step / per_epoch, 2), "loss": round(running / 100, 4),
                              "s": round(time.perf_counter() - t0, 1)}), flush=True)
            running = 0.0
        if step % args.eval_every == 0 or step == steps:
            best = evaluate_and_keep(model, head, held, mask_id, args, step, best)
            torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "step": step, "best": best}, state_path)


def head_loss(head: SamplerHead, weight: Tensor, hidden: Tensor, prev: Tensor, target: Tensor) -> Tensor:
    """Cross-entropy of the head's tokens over the whole vocabulary (LM head `weight`), for rows with their hidden
    states, the tokens before their targets, and the targets."""
    return F.cross_entropy(F.linear(head(hidden, weight[prev]), weight).float(), target)


def chain_loss(head: SamplerHead, weight: Tensor, hidden: Tensor, p: Packed, chunks: list[list[Chunk]],
               mask_id: int, rows: int, generator: torch.Generator) -> Tensor:
    """The head's loss on up to `rows` of a training batch's MASK rows of chained layouts (CHAIN_MIX's kinds), drawn
    by `generator`: the loss that trains the head together with the adapter whose hidden states [B, Q, D] it reads."""
    chained = torch.tensor([KINDS.index(k) for k in KINDS if getattr(CHAIN_MIX, k)])
    sel = mask_rows(p.ids, p.targets, mask_id) & torch.isin(p.kind_index(), chained)
    picked = torch.randperm(int(sel.sum()), generator=generator)[:rows]
    device = hidden.device
    prev = previous_tokens(chunks, p.ids.shape[1])[sel][picked].to(device)
    return head_loss(head, weight, hidden[sel.to(device)][picked.to(device)], prev, p.targets[sel][picked].to(device))


def sampler_step(model: Transformer, head: SamplerHead, opt: torch.optim.Optimizer, data: dict[str, Tensor],
                 pick: Tensor, lr: float, args: argparse.Namespace) -> float:
    """One optimizer step on the stored rows `pick`: cross-entropy of the head's tokens over the whole vocabulary."""
    weight = model.embed_tokens.weight
    for group in opt.param_groups:
        group["lr"] = lr
    hidden = data["hidden"][pick].to(args.device).float()
    prev, target = data["prev"][pick].to(args.device), data["target"][pick].to(args.device)
    with torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16, enabled=args.bf16):
        loss = head_loss(head, weight, hidden, prev, target)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()


def evaluate_and_keep(model: Transformer, head: SamplerHead, held: list[dict], mask_id: int,
                      args: argparse.Namespace, step: int, best: float) -> float:
    """The held-out chain figures at this step, logged; the head exported when they beat `best`. The new best."""
    figures = chain_figures(model, head.eval(), held, mask_id, args.device, args.eval_sequences)
    head.train()
    with (args.workdir / "heldout.jsonl").open("a") as f:
        f.write(json.dumps({"step": step, **figures}) + "\n")
    print("heldout", json.dumps(figures), flush=True)
    now = figures["chain_causal4"] + figures["chain_block8"]
    if now <= best:
        return best
    if args.export:
        save_sampler(head, args.export)
        print(f"exported to {args.export}", flush=True)
    return now
