"""The sampler head and its chained MASK drafts (backend/model/sampler_head.py, backend/engine/draft_chain.py):
the forward's hidden states the chain reads, an untrained head drafting what the rows do, the sequential chain
equal to the head's teacher-forced scores along its own drafts, its proposal covering every draw at T > 0, the
file's round trip and a clear error for a bad one, and on the tiny model the whole pipeline: an adapter, a head
trained on its rows (resumed), and every mode that chains its drafts equal to `ar` with the head on; and the default
model's shipped head: lossless, and fewer forwards than the rows alone."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from support.selfspec_data import write_answers

from specscope.backend.engine.draft_chain import SAMPLER_PARAM, DraftChain
from specscope.backend.engine.engine import Engine
from specscope.backend.engine.modes import get_mode, mode_names
from specscope.backend.engine.request import Request
from specscope.backend.engine.scores import Scores
from specscope.backend.forward.fused_step import FusedDecode
from specscope.backend.model.adapters import save_adapter
from specscope.backend.model.checkpoint import load_checkpoint
from specscope.backend.model.sampler_head import SAMPLER_FILE, SamplerHead, load_sampler, save_sampler
from specscope.backend.model.source import TINY, resolve
from specscope.backend.model.transformer import LoRALinear

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
TRAIN = [sys.executable, "-m", "specscope.backend.cli", "train"]
CHAINED = [m for m in mode_names() if SAMPLER_PARAM in get_mode(m).params]
VOCAB, DIM, MASK = 512, 32, 5


def request(temperature: float = 0.0, seed: int = 0) -> Request:
    return Request("r", [1], None, {"temperature": temperature, "seed": seed}, None)


def random_head(seed: int) -> SamplerHead:
    torch.manual_seed(seed)
    head = SamplerHead(DIM, 48, candidates=8)
    torch.nn.init.normal_(head.down.weight, std=0.5)
    return head


def test_chained_modes_are_found():
    assert {"isd", "quadratic", "linear_spec"} <= set(CHAINED)


def test_the_forward_gives_the_chain_the_hidden_states_its_logits_come_from(tmp_path):
    """With a chain, every forward with MASK rows returns the rows' final normed states (the fused step and the eager
    forward alike), the states the logits are the tied head's products of; a forward without MASK rows, or a
    runtime without a chain, leaves them out; and the chain refuses rows that have none."""
    base = load_checkpoint(TINY)
    for module in base.model.modules():       # a random MASK-scoped adapter (a chain serves adapted rows)
        if isinstance(module, LoRALinear):
            module.add_adapter(4, 8.0)
            torch.nn.init.normal_(module.lora_B, std=0.05)
    save_adapter(base.model, tmp_path / "adapter")
    loaded = load_checkpoint(TINY, adapter=tmp_path / "adapter", adapter_scope="mask")
    engine = Engine(loaded, num_slots=256)
    rt = engine.rt
    weight = loaded.model.embed_tokens.weight.detach()
    ids = [7, rt.mask_id, rt.mask_id, rt.mask_id]
    req = engine.new_request("Copy: a b c", "ar", {"max_new_tokens": 1})
    rt.prefill(req)

    def verify(rows: list[int]) -> Scores:     # a verify that writes its K/V (the fused step's shape), then frees it
        positions = list(range(req.cached, req.cached + len(rows)))
        slots = rt.alloc(req, positions)
        try:
            return rt.score(req, rows, req.cached, "causal", kind="verify", write=slots)
        finally:
            rt.release(req, slots, positions, "test")

    assert isinstance(rt.backend, FusedDecode)
    assert verify(ids).hidden is None                  # no chain: none asked for
    rt.chain = DraftChain(random_head(7), weight, rt.mask_id)
    states = {}
    for name, backend in (("fused", rt.backend), ("eager", rt.eager)):
        rt.backend = backend
        scores = verify(ids)
        assert scores.hidden is not None and scores.hidden.shape == (len(ids), weight.shape[1])
        torch.testing.assert_close(scores.hidden @ weight.t(), scores.logits, atol=1e-4, rtol=1e-4)
        assert verify([7, 8]).hidden is None           # no MASK row
        states[name] = scores.hidden
    torch.testing.assert_close(states["fused"], states["eager"], atol=1e-4, rtol=1e-3)
    assert scores.rows(slice(1, 3)).hidden.shape == (2, weight.shape[1])
    with pytest.raises(ValueError, match="hidden states"):
        rt.chain.draw(Scores(scores.logits, request(), rt.mask_id), previous=7, argmax=True)


def test_an_untrained_head_drafts_what_the_rows_do():
    torch.manual_seed(1)
    weight = torch.randn(VOCAB, DIM)
    chain = DraftChain(SamplerHead(DIM, 48, candidates=8), weight, MASK)
    hidden = torch.randn(5, DIM)
    logits = hidden @ weight.t()
    masks = Scores(logits, request(), MASK, hidden)
    drafts, proposal = chain.draw(masks, previous=7, argmax=True)
    assert drafts == masks.argmax()
    assert ((proposal.logits > float("-inf")).sum(-1) == 8).all()     # only each row's top 8 are ranked
    assert torch.allclose(proposal.logits.max(-1).values, logits.max(-1).values, atol=1e-3)


def test_the_chain_is_the_heads_scores_along_its_own_drafts():
    """Each draft is the argmax of the head given the draft before it: the sequential draw equals the head's
    teacher-forced scores over the drafts shifted by one, and a different first token changes the chain."""
    torch.manual_seed(2)
    weight = torch.randn(VOCAB, DIM)
    head = random_head(3)
    chain = DraftChain(head, weight, MASK)
    hidden = torch.randn(6, DIM)
    logits = hidden @ weight.t()
    drafts, proposal = chain.draw(Scores(logits, request(), MASK, hidden), previous=11, argmax=True)
    before = torch.tensor([11] + drafts[:-1])
    masked = logits.clone()
    masked[:, MASK] = float("-inf")
    forced = head.rescore(masked, hidden, weight[before], weight)
    assert forced.argmax(-1).tolist() == drafts
    assert torch.allclose(forced, proposal.logits, atol=1e-4)
    others = {tuple(chain.draw(Scores(logits, request(), MASK, hidden), previous=p, argmax=True)[0])
              for p in range(20, 40)}
    assert len(others) > 1


def test_draws_at_temperature_come_from_their_proposal_and_repeat_with_the_seed():
    torch.manual_seed(4)
    weight = torch.randn(VOCAB, DIM)
    chain = DraftChain(random_head(5), weight, MASK)
    hidden = torch.randn(6, DIM)
    logits = hidden @ weight.t()
    first, proposal = chain.draw(Scores(logits, request(0.9, seed=8), MASK, hidden), previous=3, argmax=False)
    again, _ = chain.draw(Scores(logits, request(0.9, seed=8), MASK, hidden), previous=3, argmax=False)
    assert first == again and MASK not in first
    q = torch.softmax(proposal.logits / 0.9, -1)
    assert all(q[j, tok] > 0 for j, tok in enumerate(first))


def test_the_head_file_round_trips_and_a_bad_one_is_refused(tmp_path):
    head = random_head(6)
    save_sampler(head, tmp_path / "new" / "folder")      # made when missing
    back = load_sampler(tmp_path / "new" / "folder" / SAMPLER_FILE)
    assert back.candidates == 8
    x, prev = torch.randn(3, DIM), torch.randn(3, DIM)
    assert torch.allclose(back(x, prev), head(x, prev), atol=0.05)      # stored in bf16
    save_file({"up.weight": torch.zeros(2, 2)}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(ValueError, match="not a sampler head"):
        load_sampler(tmp_path / "bad.safetensors")


@pytest.mark.extended   # a training run: make test-all
def test_tiny_pipeline_trains_a_head_that_keeps_every_chained_mode_lossless(tmp_path):
    """A short adapter run, then the head on its rows (one epoch, then one more resumed after answers were
    appended to the data, whose rows join the stored ones); with the head exported beside the adapter, the engine
    chains the drafts and every mode that does equals ar."""
    base = load_checkpoint(TINY)
    engine = Engine(base, num_slots=2048)
    data = write_answers(engine, tmp_path / "train.jsonl")
    more = write_answers(engine, tmp_path / "more.jsonl", count=4)
    adapter = tmp_path / "adapter"
    subprocess.run([*TRAIN, "adapter", "--model", "tiny", "--workdir", str(tmp_path / "a"),
                    "--data", str(data), "--heldout", str(data), "--batch", "2", "--rank", "4", "--steps", "2",
                    "--export", str(adapter)], cwd=ROOT, check=True, capture_output=True, timeout=300)
    work = tmp_path / "s"
    common = [*TRAIN, "head", "--model", "tiny", "--adapter", str(adapter),
              "--workdir", str(work), "--data", str(data), "--heldout", str(data), "--batch", "16",
              "--width", "64", "--candidates", "8", "--eval-sequences", "4", "--eval-every", "1000",
              "--export", str(adapter)]
    runs = []
    for epochs in ("1", "2"):
        runs.append(subprocess.run([*common, "--epochs", epochs], cwd=ROOT, check=True, capture_output=True,
                                   text=True, timeout=300).stdout)
        data.write_text(data.read_text() + more.read_text())
    counts = [re.search(r"(\d+) training rows from (\d+) answers", out).groups() for out in runs]
    (rows_before, answers_before), (rows_after, answers_after) = ((int(a), int(b)) for a, b in counts)
    assert (answers_before, answers_after) == (8, 12) and rows_after > rows_before
    figures = [json.loads(line) for line in (work / "heldout.jsonl").read_text().splitlines()]
    first, second = (f["step"] for f in figures)
    assert first == rows_before // 16 and second == 2 * (rows_after // 16)
    assert f"resumed at step {first}" in runs[1]
    assert all(f[k] >= 1 for f in figures for k in ("rows_causal4", "chain_causal4", "rows_block8", "chain_block8"))
    chained = Engine(load_checkpoint(TINY, adapter=adapter), num_slots=2048, check_invariants=True)
    assert chained.rt.chain is not None and chained.rt.chain.head.candidates == 8
    for prompt in ("What is 12 + 30?", "Sort: 5 3 9 1", "Copy: a b c"):
        ar = engine.generate(prompt, "ar", {"max_new_tokens": 16}).output_ids
        for mode in CHAINED:
            assert chained.generate(prompt, mode, {"max_new_tokens": 16}).output_ids == ar, (mode, prompt)
    assert chained.rt.pool.free_count == chained.rt.pool.num_slots


@pytest.mark.real_model
@pytest.mark.slow
def test_the_shipped_head_chains_the_default_models_drafts_losslessly():
    """The default model with its adapter and head: every chaining mode equals ar with KV invariants, and the
    chain accepts more drafts than the rows alone over these prompts (the head works)."""
    src = resolve(None)
    engine = Engine(load_checkpoint(src.folder, adapter=src.adapter, name=src.name), num_slots=4096,
                    check_invariants=True)
    assert engine.rt.chain is not None
    tokens = {True: 0, False: 0}
    rounds = {True: 0, False: 0}
    for prompt in ("List five animals.", "Write a Python function that reverses a string.",
                   "Why is the sky blue?"):
        ar = engine.generate(prompt, "ar", {"max_new_tokens": 24}).output_ids
        for mode in CHAINED:
            for chained in (True, False):
                run = engine.generate(prompt, mode, {"max_new_tokens": 24, "sampler": chained})
                assert run.output_ids == ar, (mode, prompt, chained)
                tokens[chained] += len(run.output_ids)
                rounds[chained] += run.metrics["nfe"]
    assert tokens[True] == tokens[False] and rounds[True] < rounds[False]
    assert engine.rt.pool.free_count == engine.rt.pool.num_slots


def test_the_head_trains_together_with_the_adapter(tmp_path):
    """--head: the chain loss joins the adapter's objective (both move), the held-out figures are the chain's, the
    export carries adapter and head, a resumed run restores both, and every chaining mode stays equal to ar."""
    base = load_checkpoint(TINY)
    engine = Engine(base, num_slots=2048)
    data = write_answers(engine, tmp_path / "train.jsonl")
    start = SamplerHead(base.model.cfg.hidden_size, 64, candidates=8)
    save_sampler(start, tmp_path / "start")
    work, adapter = tmp_path / "joint", tmp_path / "adapter"
    common = [*TRAIN, "adapter", "--model", "tiny", "--workdir", str(work),
              "--data", str(data), "--heldout", str(data), "--batch", "2", "--rank", "4", "--eval-every", "1",
              "--eval-sequences", "4", "--head", str(tmp_path / "start" / SAMPLER_FILE), "--head-rows", "64",
              "--lr", "1e-2", "--export", str(adapter)]
    for steps in ("2", "3"):
        done = subprocess.run([*common, "--steps", steps], cwd=ROOT, check=True, capture_output=True, text=True,
                              timeout=300)
    assert "resumed at step 2" in done.stdout
    curves = [json.loads(line) for line in (work / "curves.jsonl").read_text().splitlines()]
    assert [c["step"] for c in curves] == [1, 2, 3] and all(c["chain"] > 0 for c in curves)
    figures = [json.loads(line) for line in (work / "heldout.jsonl").read_text().splitlines()]
    assert [f["step"] for f in figures] == [0, 1, 2, 3] and all(f["chain_block8"] >= 1 for f in figures)
    trained = load_sampler(adapter / SAMPLER_FILE)
    assert not start.down.weight.any() and trained.down.weight.any()     # the zero-initialised layer moved
    chained = Engine(load_checkpoint(TINY, adapter=adapter), num_slots=2048, check_invariants=True)
    assert chained.rt.chain is not None
    for prompt in ("What is 12 + 30?", "Copy: a b c"):
        ar = engine.generate(prompt, "ar", {"max_new_tokens": 16}).output_ids
        for mode in CHAINED:
            assert chained.generate(prompt, mode, {"max_new_tokens": 16}).output_ids == ar, (mode, prompt)
    assert chained.rt.pool.free_count == chained.rt.pool.num_slots
