"""SpecFold: the folded attention correction on random tensors, and the folded forward on the shipped model."""
import pytest
import torch
from support.branches import BRANCH_CASES, random_branches, reference_attention
from support.fold_oracle import Float64FoldedForward, branch_attention, fold_backend, resolve_sources
from support.modes import HELDOUT_GEN
from support.spiffy import branch_logits, stacked

from specscope.backend.engine.modes.spiffy import DenseVerify
from specscope.backend.forward.plan import Fold
from specscope.backend.tracing import RecordingTracer

GEN = {"max_new_tokens": 32}


@BRANCH_CASES
def test_folded_attention_equals_exact_attention_over_own_kv(parents, heads, kv_heads, prefix, density):
    q, k, v, pk, pv, recompute = random_branches(parents, heads, kv_heads, prefix, density)
    out = branch_attention(q, k, v, recompute, parents, pk, pv)
    want, src = reference_attention(q, k, v, recompute, parents, pk, pv)
    assert torch.equal(resolve_sources(recompute, parents), src)
    torch.testing.assert_close(out.float(), want, atol=1e-5, rtol=1e-5)


def test_folding_needs_a_recomputed_main_row():
    rec = torch.ones(2, 3, dtype=torch.bool)
    rec[0, 1] = False
    with pytest.raises(ValueError, match="main row"):
        resolve_sources(rec, [-1, 0])


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_strict_delta_zero_logits_match_the_dense_forward_for_every_branch(spiffy_engine, heldout_prompts,
                                                                          monkeypatch, backend):
    """ffn_gate=strict at δ=0 equals the dense forward; the paper's one gate at δ=0 does not (it reuses FFN
    outputs whose attention input changed)."""
    dense = DenseVerify.__call__
    errors, paper_errors, folded_rows = [], [], []

    def verify_twice(self, req, rt, start, states, parents):
        scores = yield from dense(self, req, rt, start, states, parents)
        if len(states) > 1:
            logits = stacked(scores)

            def run(gate):
                out, counts = branch_logits(rt, req, start, states, fold_backend(rt.model, backend),
                                            Fold(tuple(parents), 0.0, gate))
                return float((out - logits).abs().max()), counts
            err, counts = run("strict")
            errors.append(err)
            paper_errors.append(run("paper")[0])
            folded_rows.append(sum(len(states[0]) - c for c in counts.qkv[0][1:]))
        return scores

    monkeypatch.setattr(DenseVerify, "__call__", verify_twice)
    for prompt in heldout_prompts:
        spiffy_engine.generate(prompt, "spiffy", {"max_new_tokens": 16})
        if len(errors) >= 6:
            break
    assert len(errors) >= 6 and max(errors) <= 1e-4, errors
    assert max(paper_errors) > 1e-2, paper_errors
    assert all(folded_rows), "δ=0 folds the bit-identical embeddings of layer 0"


@pytest.mark.slow
def test_specfold_delta_zero_runs_as_spiffy_and_folds_only_layer_0(heldout_runs):
    """On the held-out runs whose tokens test_modes finds equal to spiffy's (δ=0, strict gate; the same runs,
    kept for the session): the same forwards, and where drafts were verified only layer 0's bit-identical
    embeddings fold."""
    sps = heldout_runs("spiffy", HELDOUT_GEN)
    sfs = heldout_runs("specfold", {**HELDOUT_GEN, "delta": 0.0, "ffn_gate": "strict"})
    verified = 0
    for prompt, sp, sf in zip(heldout_runs.prompts, sps, sfs, strict=True):
        assert sf.status == sp.status == "done"
        assert sf.metrics["nfe"] == sp.metrics["nfe"], prompt
        if sf.metrics["drafts_verified"]:
            verified += 1
            assert 0 < sf.metrics["fold_ratio"] < 0.5, prompt     # δ=0 folds layer 0's unchanged embeddings only
    assert verified >= 3


@pytest.mark.slow
def test_specfold_default_delta_folds_and_traces(spiffy_engine, heldout_prompts):
    layers = spiffy_engine.rt.model.cfg.num_hidden_layers
    folds, ratios = [], []
    for prompt in heldout_prompts[::5]:
        tracer = RecordingTracer()
        res = spiffy_engine.generate(prompt, "specfold", GEN, tracer=tracer)
        assert res.status == "done" and res.metrics["kv_leaked"] == 0
        if res.metrics["fold_ratio"] is not None:
            ratios.append(res.metrics["fold_ratio"])
        folds += [e for e in tracer.events if e["type"] == "round" and e.get("fold")]
    assert ratios and all(0 < r <= 1 for r in ratios)
    assert len(folds) >= 3
    for e in folds:
        assert len(e["fold"]) == layers and e["extra"]["fold_ffn"] == e["fold"]    # paper: one gate for both
        assert all(len(row) == len(e["branches"]) for row in e["fold"])
        assert all(row[0] == e["block_size"] for row in e["fold"])     # the main row recomputes every position


@pytest.mark.slow
@pytest.mark.extended
def test_kernel_pipeline_under_the_interpreter_equals_reference_and_dense(spiffy_engine, heldout_prompts,
                                                                          monkeypatch):
    """A whole verification step through the Triton kernels (TRITON_INTERPRET=1): at δ=0.1 (paper gate) it
    equals the float64 PyTorch reference, at δ=0 with the strict FFN gate the dense forward, both within 1e-3.
    One step: the interpreter is slow."""
    from specscope.backend.forward.folded import KernelFoldedForward
    dense = DenseVerify.__call__
    results = []

    def verify_and_compare(self, req, rt, start, states, parents):
        scores = yield from dense(self, req, rt, start, states, parents)
        if len(states) > 1 and not results:
            def run(backend, delta, gate="paper"):
                return branch_logits(rt, req, start, states, backend, Fold(tuple(parents), delta, gate))
            kernels = KernelFoldedForward(rt.model, triton=True)
            oracle = Float64FoldedForward(rt.model)
            results.append((*run(oracle, 0.1), *run(kernels, 0.1), len(parents), stacked(scores),
                            run(kernels, 0.0, "strict")[0]))
        return scores

    monkeypatch.setattr(DenseVerify, "__call__", verify_and_compare)
    for prompt in heldout_prompts:
        spiffy_engine.generate(prompt, "spiffy", {"max_new_tokens": 8})
        if results:
            break
    assert results
    want, ref, got, kern, branches, dense_logits, got_zero = results[0]
    assert kern == ref
    draft_recomputed = sum(sum(layer[1:]) for layer in kern.qkv)
    assert 0 < draft_recomputed < (branches - 1) * len(kern.qkv) * want.shape[1]  # some of each
    torch.testing.assert_close(got, want, atol=1e-3, rtol=0)
    torch.testing.assert_close(got_zero, dense_logits, atol=1e-3, rtol=0)


@pytest.mark.slow
def test_specfold_triton_backend_equals_torch_backend(spiffy_engine, heldout_prompts):
    """backend=triton on CPU runs the kernels' PyTorch twins: same tokens and fold counts as the packed
    float32 path (backend=torch)."""
    compared = 0
    for prompt in heldout_prompts[::8]:
        ref = spiffy_engine.generate(prompt, "specfold", GEN)
        kern = spiffy_engine.generate(prompt, "specfold", {**GEN, "backend": "triton"})
        assert kern.output_ids == ref.output_ids, prompt
        assert kern.metrics["fold_ratio"] == ref.metrics["fold_ratio"]
        compared += ref.metrics["drafts_verified"] > 0
    assert compared >= 2
    zero = spiffy_engine.generate(heldout_prompts[0], "specfold", {**GEN, "delta": 0.0, "backend": "triton",
                                                                   "ffn_gate": "strict"})
    assert zero.output_ids == spiffy_engine.generate(heldout_prompts[0], "spiffy", GEN).output_ids
    assert spiffy_engine.rt.pool.used == 0


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_folded_backends_apply_a_mask_scoped_adapter_at_its_rows(loaded, backend):
    """A [R, N] adapter map (the shipped real model's MASK scope: on at MASK positions only) reaches the packed
    rows of each folded backend: strict δ=0 equals the eager forward of the same rows, map and all."""
    import copy

    from specscope.backend.forward.plan import Eager, ForwardPlan

    model = copy.deepcopy(loaded.model)
    torch.manual_seed(0)
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "add_adapter"):
                module.add_adapter(4, 8.0)
                module.lora_B.normal_(0, 0.05)
    mask = loaded.mask_token_id
    main = torch.randint(3, 200, (8,))
    main[3:] = mask
    ids = torch.stack([main, main.clone(), main.clone(), main.clone()])
    ids[1, 3], ids[2, 4], ids[3, 3:5] = 7, 9, torch.tensor([7, 11])   # branches fill some of main's masks
    positions = torch.arange(20, 28).expand(4, -1)
    plan = ForwardPlan(ids, positions, "block", None, adapter=ids == mask)
    with torch.inference_mode():
        want = Eager(model).run(plan).logits
        got = fold_backend(model, backend).run(ForwardPlan(ids, positions, "block", None, adapter=ids == mask,
                                                             fold=Fold((-1, 0, 0, 1), 0.0, "strict"))).logits
        unadapted = Eager(model).run(ForwardPlan(ids, positions, "block", None)).logits
    assert float((got - want).abs().max()) <= 1e-4
    assert float((unadapted - want).abs().max()) > 1e-3, "the adapter changes the masked rows' logits"
