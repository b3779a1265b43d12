"""Train the tiny tri-mode model on offline text (resumable, reproducible), and export the shipped checkpoint
(the command line: `specscope train tiny`).

Each step's batch is a pure function of (seed, step), so a resumed run sees exactly the batches an
uninterrupted run would. Per-objective losses go to <workdir>/curves.jsonl.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specscope.backend.model.checkpoint import CARD_FILE, load_model, save_checkpoint
from specscope.backend.model.config import ModelConfig
from specscope.backend.model.tokenizer import MASK, load_tokenizer, train_tokenizer
from specscope.backend.model.transformer import Transformer
from specscope.backend.train import tasks, tiny_data
from specscope.backend.train.card import model_card

OBJECTIVES = ("ar", "bd", "idlm")
LOSS_WEIGHTS = {"ar": 1.0, "bd": 1.0, "idlm": 0.5}


def model_config(vocab_size: int, mask_id: int, eos_id: int) -> ModelConfig:
    return ModelConfig(vocab_size=vocab_size, hidden_size=256, intermediate_size=768, num_hidden_layers=6,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=64, family="qwen3",
                       rope_theta=10000.0, max_position_embeddings=1024, tie_word_embeddings=True,
                       qk_norm=True, mask_token_id=mask_id, eos_token_id=eos_id)


def prepare(workdir: Path, vocab_size: int, seed: int, init_from: str | None = None) -> None:
    """Tokenizer (trained here, or the warm-start checkpoint's) and tokenized text streams, once per workdir."""
    if (workdir / "train_tokens.npy").exists():
        return
    workdir.mkdir(parents=True, exist_ok=True)
    train_docs = tiny_data.text_documents("train")
    if init_from:
        tok = load_tokenizer(init_from)
    else:
        sample = [t for _, t in train_docs[:: 4]]
        sample += [tiny_data.chat_text(t.prompt, t.answer) for t in tasks.task_set("train", 2000, seed)]
        tok = train_tokenizer(sample, vocab_size)
    tok.save_pretrained(workdir / "tokenizer")
    np.save(workdir / "train_tokens.npy", tiny_data.tokenize_documents(tok, train_docs))
    np.save(workdir / "heldout_tokens.npy", tiny_data.tokenize_documents(tok, tiny_data.text_documents("heldout")))
    names = sorted(n for n, _ in train_docs)
    recipe = {"python": platform.python_version(), "train_documents": len(names),
              "train_documents_sha256": hashlib.sha256("\n".join(names).encode()).hexdigest()}
    (workdir / "recipe.json").write_text(json.dumps(recipe, indent=1))


def objective_losses(model: Transformer, batch: tiny_data.TriBatch) -> dict[str, torch.Tensor]:
    """Mean cross-entropy of each objective on its own stream of the batch."""
    logits = model(batch.ids, batch.positions[None].expand_as(batch.ids), mask=batch.mask)
    t = batch.ids.shape[1] // 3
    out = {}
    for k, name in enumerate(OBJECTIVES):
        sl = slice(k * t, (k + 1) * t)
        out[name] = F.cross_entropy(logits[:, sl].flatten(0, 1), batch.labels[:, sl].flatten(),
                                    ignore_index=tiny_data.IGNORE)
    return out


def truncate_curves(path: Path, step: int) -> None:
    """Drop logged rows past the resumed step (written after the last save of an interrupted run)."""
    if path.exists():
        rows = [line for line in path.open() if json.loads(line)["step"] <= step]
        path.write_text("".join(rows))


def lr_at(step: int, total: int, peak: float, warmup: int = 100) -> float:
    """Linear warm-up, then cosine decay to 10 % of peak at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    workdir = Path(args.workdir)
    prepare(workdir, args.vocab, args.seed, args.init_from)
    tok = load_tokenizer(workdir / "tokenizer")
    stream = np.load(workdir / "train_tokens.npy")
    mask_id, eos_id = tok.convert_tokens_to_ids(MASK), tok.eos_token_id
    torch.manual_seed(args.seed)
    model = Transformer(model_config(len(tok), mask_id, eos_id))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    spec = tiny_data.BatchSpec(seq_len=args.seq, batch_size=args.batch, task_fraction=args.task_fraction,
                               pad_tasks=not args.no_pad_tasks)
    step = 0
    state_path = workdir / "state.pt"
    if args.init_from and not state_path.exists():
        model.load_state_dict(load_model(args.init_from).state_dict())
        print(f"warm start from {args.init_from} (fresh optimizer)", flush=True)
    if state_path.exists():
        state = torch.load(state_path, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
        truncate_curves(workdir / "curves.jsonl", step)
        print(f"resumed at step {step}", flush=True)
    meta = {"seed": args.seed, "steps": args.steps, "lr": args.lr, "batch": asdict(spec), "init_from": args.init_from,
            "bf16": args.bf16, "threads": args.threads,
            "loss_weights": LOSS_WEIGHTS, "params": sum(p.numel() for p in model.parameters())}
    (workdir / "train_args.json").write_text(json.dumps(meta, indent=1))
    curves = (workdir / "curves.jsonl").open("a")
    model.train()
    while step < args.steps:
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr)
        batch = tiny_data.make_batch(tok, stream, spec, args.seed, step, mask_id)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            losses = objective_losses(model, batch)
        loss = sum(LOSS_WEIGHTS[k] * v for k, v in losses.items())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        row = {"step": step, "lr": opt.param_groups[0]["lr"], "s": round(time.perf_counter() - t0, 3),
               **{k: round(v.item(), 4) for k, v in losses.items()}}
        curves.write(json.dumps(row) + "\n")
        curves.flush()
        if step % 10 == 0:
            print(row, flush=True)
        if step % args.save_every == 0 or step == args.steps:
            tmp = state_path.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            tmp.replace(state_path)


def export(args: argparse.Namespace) -> None:
    """Write the fp16 shipped checkpoint (config, safetensors, tokenizer, training metadata)."""
    workdir, out = Path(args.workdir), Path(args.export)
    tok = load_tokenizer(workdir / "tokenizer")
    state = torch.load(workdir / "state.pt", weights_only=False)
    model = Transformer(model_config(len(tok), tok.convert_tokens_to_ids(MASK), tok.eos_token_id))
    model.load_state_dict(state["model"])
    curves = [json.loads(line) for line in (workdir / "curves.jsonl").open()]
    train_args = json.loads((workdir / "train_args.json").read_text())
    meta = {"step": state["step"], "recipe": json.loads((workdir / "recipe.json").read_text()),
            "train_args": train_args,
            "curves_every_50": [c for c in curves if c["step"] % 50 == 0 and c["step"] <= state["step"]]}
    if train_args.get("init_from"):   # keep the warm start's own record (read before `out` is overwritten)
        parent = Path(train_args["init_from"]) / "training.json"
        meta["warm_start"] = json.loads(parent.read_text()) if parent.exists() else None
    save_checkpoint(model, tok, out, meta)
    (out / CARD_FILE).write_text(json.dumps(model_card(), indent=1))
    print(f"exported step {state['step']} to {out}")
