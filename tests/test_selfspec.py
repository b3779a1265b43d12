"""The self-speculation adapter's pipeline on the tiny model: the training layouts are the modes' own attention
layouts (checked against the engine's forwards), the prompt set's held-out split, the answer generator (greedy and
drawn answers side by side, resumable), a short resumable training run, and its exported adapter: MASK-scoped, so
ar is unchanged and the lossless modes stay equal to it."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.selfspec_data import write_answers

from specscope.backend.cli import main
from specscope.backend.engine.engine import Engine
from specscope.backend.engine.lossless import claim_of
from specscope.backend.engine.modes import baseline, mode_names
from specscope.backend.model.adapters import save_adapter
from specscope.backend.model.checkpoint import load_checkpoint
from specscope.backend.model.source import TINY
from specscope.backend.model.transformer import KVContext, PagedKV
from specscope.backend.train.adapter import prepare_model
from specscope.backend.train.answers import generate
from specscope.backend.train.layouts import IGNORE, Mix, block_chunk, causal_chunk, chunks_for, partial_chunk
from specscope.backend.train.packing import chunk_logits, pack
from specscope.backend.train.prompts import HELD_OUT, TEMPLATES, prompt_set

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
TRAIN = [sys.executable, "-m", "specscope.backend.cli", "train"]


def test_layout_targets_are_the_tokens_each_row_drafts():
    x, m = list(range(100, 120)), 0
    b = block_chunk(x, 5, 4, m)
    assert b.ids == [105, m, m, m] and b.targets == [106, 107, 108, IGNORE] and b.positions == [5, 6, 7, 8]
    c = causal_chunk(x, 5, 3, m)
    assert c.ids == [105, m, m, m] and c.targets == [IGNORE, 107, 108, 109]
    p = partial_chunk(x, 5, 8, m, 0.5, random.Random(0))
    for i, t in enumerate(p.targets):   # trained exactly where the next position is masked
        assert (t != IGNORE) == (i + 1 < 8 and p.ids[i + 1] == m) and (t == IGNORE or t == x[5 + i + 1])
    assert all(tok == x[5 + i] for i, tok in enumerate(p.ids) if tok != m)
    near_end = block_chunk(x, 17, 4, m)
    assert near_end.targets == [118, 119, IGNORE, IGNORE]
    assert all(c.seed >= 9 for c in chunks_for(x, 10, m, Mix(), random.Random(1)))   # seeds in the answer


def test_held_out_templates_cover_every_category_and_stay_apart():
    categories = {t.category for t in TEMPLATES}
    assert {t.category for t in TEMPLATES if t.tid in HELD_OUT} == categories
    assert 0.15 <= len(HELD_OUT) / len(TEMPLATES) <= 0.3
    train, held = prompt_set(300, 0, held_out=False), prompt_set(60, 0, held_out=True)
    assert not {r["template"] for r in train} & {r["template"] for r in held}
    assert {r["template"] for r in held} <= HELD_OUT
    assert len({(r["template"], r["messages"][0]["content"]) for r in train}) == 300   # no prompt twice
    assert prompt_set(50, 3) == prompt_set(50, 3)


def test_the_data_commands_write_the_prompt_set_and_its_answers(tmp_path, capsys):
    """`specscope data prompts` writes the prompt set as JSONL; `specscope data answers` the model's own ar
    answers to a split's prompts, resumably (a rerun appends nothing)."""
    prompts = tmp_path / "prompts.jsonl"
    assert main(["data", "prompts", "--count", "20", "--seed", "3", "--out", str(prompts)]) == 0
    assert [json.loads(line) for line in prompts.read_text().splitlines()] == prompt_set(20, 3)
    out = tmp_path / "answers.jsonl"
    argv = ["data", "answers", "--model", "tiny", "--split", "heldout", "--count", "2", "--batch", "2",
            "--max-new-tokens", "6", "--device", "cpu", "--out", str(out)]
    assert main(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["template"] for r in rows} <= HELD_OUT and len(rows) >= 2
    assert main(argv) == 0 and len(out.read_text().splitlines()) == len(rows)
    engine = Engine(load_checkpoint(TINY), num_slots=2048)
    assert engine.generate(rows[0]["messages"], "ar", {"max_new_tokens": 6}).output_ids == rows[0]["answer_ids"]
    capsys.readouterr()


@pytest.fixture(scope="module")
def trainee():
    model, embed = prepare_model(TINY, rank=4, alpha=8.0, device="cpu")
    torch.manual_seed(0)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.02)
    embed.row.data.normal_(0, 0.5)
    return model.eval(), embed


def test_the_generator_resumes_and_keeps_greedy_and_drawn_answers_apart(tmp_path):
    """Greedy answers are ar's own; a rerun adds nothing; answers drawn at T > 0 join the same file under keys
    of their own, each reproducible from its recorded temperature and seed."""
    engine = Engine(load_checkpoint(TINY), num_slots=4096)
    rows, out = prompt_set(6, 0, held_out=False), tmp_path / "answers.jsonl"

    def read() -> list[dict]:
        return [json.loads(line) for line in out.read_text().splitlines()]

    generate(engine, rows, out, batch=4, max_new_tokens=8)
    greedy = read()
    generate(engine, rows, out, batch=4, max_new_tokens=8)
    assert read() == greedy and len(greedy) >= len(rows)
    generate(engine, rows, out, batch=4, max_new_tokens=8, temperature=1.0, seed=1)
    drawn = read()[len(greedy):]
    assert len(drawn) == len(greedy) and all(d["temperature"] == 1.0 for d in drawn)
    assert {g["key"] for g in greedy}.isdisjoint(d["key"] for d in drawn)
    for g in greedy[:3]:
        assert engine.generate(g["messages"], "ar", {"max_new_tokens": 8}).output_ids == g["answer_ids"]
    for d in drawn[:3]:
        again = engine.generate(d["messages"], "ar", {"max_new_tokens": 8, "temperature": 1.0, "seed": d["seed"]})
        assert again.output_ids == d["answer_ids"]
    by_messages = {json.dumps(g["messages"]): g["answer_ids"] for g in greedy}
    firsts = [d for d in drawn if json.dumps(d["messages"]) in by_messages]
    assert len(firsts) == len(rows)
    assert any(d["answer_ids"] != by_messages[json.dumps(d["messages"])] for d in firsts)


@pytest.mark.parametrize(("kind", "scope"), [("block", "mask"), ("causal", "mask"), ("block", "draft")])
def test_packed_chunks_equal_the_engines_forwards(trainee, kind, scope):
    """Each chunk row of the packed training forward gives the logits the mode's own forward gives: the prefix
    written causally into KV slots, then the chunk read-only in `block` (linear_spec's draft) or `causal`
    (isd's MASK specs) attention, the adapter on at MASK (scope "mask") or on the whole draft forward (scope
    "draft", as the runtime applies a draft-scoped adapter to linear_spec's draft pass)."""
    model, embed = trainee
    mask = embed.mask_id
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(3, 1000, (n,), generator=g).tolist() for n in (23, 17)]
    make = block_chunk if kind == "block" else causal_chunk
    chunks = [[make(seqs[0], 6, 5, mask), make(seqs[0], 14, 4, mask)], [make(seqs[1], 9, 6, mask)]]
    p = pack(seqs, chunks, mask, pad_id=1)
    with torch.no_grad():
        got = chunk_logits(model, p, PagedKV.empty(model.cfg, 2 * p.clean_ids.shape[1], torch.float32, "cpu"),
                           scope)
    for i, (seq, cs) in enumerate(zip(seqs, chunks, strict=True)):
        for (_, row, n), c in zip(p.kinds[i], cs, strict=True):
            cache = PagedKV.empty(model.cfg, 64, torch.float32, "cpu")
            slots = torch.arange(c.seed)[None]
            with torch.no_grad():
                model(torch.tensor([seq[:c.seed]]), torch.arange(c.seed)[None],
                      kv=KVContext(cache, torch.zeros(1, 0, dtype=torch.long), None, slots))
                ids = torch.tensor([c.ids])
                want = model(ids, torch.tensor([c.positions]), attn=kind, kv=KVContext(cache, slots),
                             lora=ids == mask if scope == "mask" else True)
            assert (got[i, row:row + n] - want[0]).abs().max().item() < 1e-4


@pytest.mark.extended
def test_training_resumes_exports_and_keeps_ar_exact(tmp_path):
    """Two steps, then two more from the saved state; the exported adapter is MASK-scoped with a trained MASK
    row: ar's tokens equal the bare model's, and every mode that claims ar's tokens (isd, quadratic, linear_spec)
    equals ar."""
    base = load_checkpoint(TINY)
    engine = Engine(base, num_slots=2048)
    data = write_answers(engine, tmp_path / "train.jsonl")
    work, export = tmp_path / "run", tmp_path / "adapter"
    common = [*TRAIN, "adapter", "--model", "tiny", "--workdir", str(work),
              "--data", str(data), "--heldout", str(data), "--batch", "2", "--rank", "4", "--eval-every", "2",
              "--save-every", "2", "--export", str(export)]
    for steps in ("2", "4"):
        subprocess.run([*common, "--steps", steps], cwd=ROOT, check=True, capture_output=True, timeout=300)
    curves = [json.loads(line) for line in (work / "curves.jsonl").read_text().splitlines()]
    assert [c["step"] for c in curves] == [1, 2, 3, 4] and all(c["loss"] > 0 for c in curves)
    figures = [json.loads(line) for line in (work / "heldout.jsonl").read_text().splitlines()]
    assert [f["step"] for f in figures] == [0, 2, 4] and all(f["block8"] >= 1 for f in figures)
    adapted = load_checkpoint(TINY, adapter=export)
    assert adapted.adapter_scope == "mask" and adapted.model.has_lora
    assert not torch.equal(adapted.model.embed_tokens.weight[adapted.mask_token_id],
                           base.model.embed_tokens.weight[base.mask_token_id])
    ours = Engine(adapted, num_slots=2048, check_invariants=True)
    for prompt in ("What is 12 + 30?", "Sort: 5 3 9 1", "Copy: a b c"):
        ar = engine.generate(prompt, "ar", {"max_new_tokens": 16}).output_ids
        assert ours.generate(prompt, "ar", {"max_new_tokens": 16}).output_ids == ar
        for mode in [m for m in mode_names() if (claim := claim_of(m)) and claim.reference == baseline()]:
            assert ours.generate(prompt, mode, {"max_new_tokens": 16}).output_ids == ar, (mode, prompt)


def test_init_adapter_starts_from_a_saved_adapter(trainee, tmp_path):
    """--init-adapter: the trainee's LoRA and MASK row, saved as PEFT writes them, are what training starts from."""
    model, embed = trainee
    save_adapter(model, tmp_path, tokens={"embed_tokens": {embed.mask_id: embed.row.detach()}})
    again, again_embed = prepare_model(TINY, rank=8, alpha=1.0, device="cpu", init=tmp_path)
    want = {n: p for n, p in model.named_parameters() if "lora_" in n}
    got = {n: p for n, p in again.named_parameters() if "lora_" in n}
    assert want.keys() == got.keys() and all(torch.equal(want[n], got[n]) for n in want)
    assert all(p.requires_grad for p in got.values())
    assert torch.equal(again_embed.row, embed.row)


@pytest.mark.slow   # a few training steps in float32 and bf16
def test_bf16_autocast_losses_follow_float32_and_train_the_adapter(trainee):
    """--bf16: the training forward under bf16 autocast (bf16 KV for the packed cache) gives each layout kind's
    loss within bf16 rounding of float32's, and its gradients reach the LoRA and the MASK row."""
    from specscope.backend.train.adapter import draw_batch, losses
    model, embed = trainee
    rows = [{"seq": torch.randint(3, 1000, (40,), generator=torch.Generator().manual_seed(i)).tolist(),
             "prompt_len": 12} for i in range(4)]
    batch = pack(*draw_batch(rows, step=0, seed=0, size=4, mask_id=embed.mask_id, mix=Mix()), embed.mask_id, 1)
    want = {k: v.item() for k, v in losses(model, batch, "cpu").items()}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = losses(model, batch, "cpu", torch.bfloat16)
    assert got.keys() == want.keys() and all(abs(got[k].item() - want[k]) < 0.05 * want[k] for k in want)
    model.zero_grad(set_to_none=True)
    sum(got.values()).backward()
    lora = [p for n, p in model.named_parameters() if "lora_" in n]
    assert embed.row.grad is not None and all(p.grad is not None for p in lora)
    assert any(p.grad.abs().sum() > 0 for p in lora)
    model.zero_grad(set_to_none=True)


def test_a_kind_weighted_zero_gets_no_chunks():
    """--kind-weights causal=0 (the draft-scope recipe): no causal chunks are built, and the export score is the
    block figure alone."""
    from specscope.backend.cli.train import kind_weights
    from specscope.backend.train.adapter import mix_for, score
    weights = kind_weights("causal=0")
    chunks = chunks_for(list(range(100, 160)), 10, 0, mix_for(weights), random.Random(0))
    assert chunks and {c.kind for c in chunks} == {"block", "partial"}
    assert score({"block8": 2.5, "causal4": 1.5}, weights) == 2.5
    assert score({"block8": 2.5, "causal4": 1.5}, kind_weights("")) == 4.0


def test_chunk_scale_multiplies_the_layouts_a_sequence_gets():
    """--chunk-scale 2: twice the chunks of every trained kind, none of a kind weighted 0."""
    from specscope.backend.cli.train import kind_weights
    from specscope.backend.train.adapter import mix_for
    x = list(range(100, 160))
    kinds = [[c.kind for c in chunks_for(x, 10, 0, mix_for(kind_weights(w), scale), random.Random(0))]
             for w, scale in (("", 1), ("", 2), ("partial=0", 3))]
    assert all(kinds[1].count(k) == 2 * kinds[0].count(k) > 0 for k in ("block", "causal", "partial"))
    assert kinds[2].count("partial") == 0 and kinds[2].count("causal") == 3 * kinds[0].count("causal")
