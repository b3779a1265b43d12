"""Spiffy: fewer forwards than block_diffusion, KV lifecycle, trace, draft-graph files, calibration. Its token
equality with block_diffusion on the held-out prompts is tests/test_modes.py's (every lossless mode's)."""
import argparse
import json

import pytest
from support.modes import HELDOUT_GEN
from support.spiffy import engine_with_graph, graph_json
from support.traces import replay_kv

from specscope.backend.engine.draft_graph import GRAPH_FILE, GraphError, load_graph
from specscope.backend.engine.modes.spiffy import graph_nodes
from specscope.backend.engine.params import ParamError
from specscope.backend.model.checkpoint import DEFAULT_CHECKPOINT
from specscope.backend.tracing import RecordingTracer
from specscope.backend.train.domain import TASK_FAMILIES
from specscope.lab import calibrate

GEN = {"max_new_tokens": 32}


@pytest.mark.slow
def test_spiffy_spends_block_diffusions_forwards_less_those_it_saved(heldout_runs):
    """On the held-out runs whose tokens test_modes finds equal (the same runs, kept for the session): every
    spiffy run's forwards plus those its draft cache saved are block_diffusion's, and fewer in all."""
    assert len(heldout_runs.prompts) >= 30
    nfe = {"block_diffusion": 0, "spiffy": 0}
    bds, sps = heldout_runs("block_diffusion", HELDOUT_GEN), heldout_runs("spiffy", HELDOUT_GEN)
    for prompt, bd, sp in zip(heldout_runs.prompts, bds, sps, strict=True):
        assert sp.status == bd.status == "done"
        assert sp.metrics["nfe"] + sp.metrics["forwards_saved"] == bd.metrics["nfe"], prompt
        nfe["block_diffusion"] += bd.metrics["nfe"]
        nfe["spiffy"] += sp.metrics["nfe"]
    assert nfe["spiffy"] < nfe["block_diffusion"], nfe


def test_concurrent_requests_with_other_branch_counts_keep_their_own_rounds(spiffy_engine, heldout_prompts):
    """branches is request state: a branches=1 run verifies as many drafts beside a branches=7 run as alone."""
    jobs = [(heldout_prompts[2], {**GEN, "branches": 1}), (heldout_prompts[2], {**GEN, "branches": 7})]
    solo = [spiffy_engine.generate(p, "spiffy", params).metrics for p, params in jobs]
    together = spiffy_engine.run([spiffy_engine.new_request(p, "spiffy", params) for p, params in jobs])
    assert solo[0]["drafts_verified"] < solo[1]["drafts_verified"]
    for alone, beside in zip(solo, (r.metrics for r in together), strict=True):
        assert {k: beside[k] for k in ("nfe", "drafts_verified", "cache_hits")} == \
            {k: alone[k] for k in ("nfe", "drafts_verified", "cache_hits")}


def test_sampling_is_lossless_too(spiffy_engine, heldout_prompts):
    """Drafts never draw from the generator, so a seeded T > 0 run follows block_diffusion's draws."""
    params = {**GEN, "temperature": 0.8, "seed": 7}
    for prompt in heldout_prompts[:2]:
        assert (spiffy_engine.generate(prompt, "spiffy", params).output_ids
                == spiffy_engine.generate(prompt, "block_diffusion", params).output_ids)


@pytest.mark.parametrize("mode", ["spiffy", "specfold"])
def test_kv_lifecycle_and_branch_trace(spiffy_engine, heldout_prompts, mode):
    saved = 0
    for prompt in heldout_prompts[::7]:
        tracer = RecordingTracer()
        res = spiffy_engine.generate(prompt, mode, {**GEN, "branches": 5}, tracer=tracer)
        assert res.status == "done" and res.metrics["kv_leaked"] == 0
        assert replay_kv(tracer.events) == (set(), [])
        rounds = [e for e in tracer.events if e["type"] == "round" and e["round"] > 0]
        assert sum(r["nfe"] for r in rounds) == res.metrics["nfe"]
        hits = {r["round"] for r in rounds if r["branches"] and r["branches"][0]["cache_hit"]}
        assert len(hits) == res.metrics["cache_hits"]
        saved += res.metrics["forwards_saved"]
        if rounds:
            assert rounds[-1]["extra"]["forwards_saved"] == res.metrics["forwards_saved"]
        for r in rounds:
            denoised = r["nfe"] - any(p["kind"] == "refresh" for p in r["phases"])
            if r["round"] in hits:
                assert denoised == 0 and len(r["branches"]) == 1 and r["branches"][0]["id"] > 0
                continue
            assert denoised == 1 and 1 <= len(r["branches"]) <= 6
            main, *drafts = r["branches"]
            assert main["id"] == 0 and main["parent"] is None and not main["cache_hit"]
            for b in drafts:
                assert 0 <= b["parent"] < b["id"] and b["node"] in range(5)
                parent = r["branches"][b["parent"]]["tokens"]
                changed = [i for i, (x, y) in enumerate(zip(parent, b["tokens"], strict=True)) if x != y]
                assert len(changed) == 1 and parent[changed[0]] == spiffy_engine.rt.mask_id
    assert saved > 0
    assert spiffy_engine.rt.pool.used == 0


@pytest.mark.parametrize("mode,params,needle", [
    ("spiffy", {"branches": 0}, "branches"),
    ("spiffy", {"branches": 17}, "branches"),
    ("specfold", {"delta": 1.5}, "delta"),
    ("specfold", {"delta": -0.1}, "delta"),
])
def test_bad_parameters_name_the_parameter(spiffy_engine, mode, params, needle):
    with pytest.raises(ParamError, match=needle):
        spiffy_engine.generate("What is 1 + 2?", mode, params)


@pytest.mark.parametrize("mode", ["spiffy", "specfold"])
def test_missing_graph_refuses_to_start_and_says_how_to_calibrate(loaded, tmp_path, mode):
    eng = engine_with_graph(loaded, tmp_path)
    with pytest.raises(ParamError, match="specscope calibrate --model"):
        eng.generate("What is 1 + 2?", mode)
    assert eng.rt.pool.used == 0 and not eng.scheduler.has_work


def _nodes(*changes):
    nodes = graph_json()["nodes"]
    for i, key, value in changes:
        nodes[i][key] = value
    return nodes


@pytest.mark.parametrize("graph,needle", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "not a JSON object"),
    (graph_json(version=2), "unsupported version 2"),
    (graph_json(nodes=[]), "non-empty list"),
    (graph_json(branches=3), "'branches' is 3 but there are 7 nodes"),
    (graph_json(nodes=_nodes((2, "id", 5))), "node ids must be 0..6"),
    (graph_json(nodes=_nodes((3, "parent", 9))), "node 3 has parent 9"),
    (graph_json(nodes=_nodes((3, "parent", -2))), "node 3 has parent -2"),
    (graph_json(nodes=_nodes((0, "parent", 1), (1, "parent", 0))), r"cycle through nodes \[0, 1\]"),
    (graph_json(nodes=_nodes((4, "parent", 4))), r"cycle through nodes \[4\]"),
    (graph_json(nodes=_nodes((0, "parent", 2))), "node 0's parent 2 comes after it"),
    (graph_json(nodes=_nodes((1, "pos_rank", -1))), "node 1 ranks out of range"),
    (graph_json(nodes=_nodes((1, "pos_rank", 300))), "node 1 ranks out of range"),
    (graph_json(nodes=_nodes((6, "vocab_rank", -3))), "node 6 ranks out of range"),
    (graph_json(nodes=_nodes((6, "vocab_rank", "1"))), "'vocab_rank' must be an integer"),
    (graph_json(nodes=_nodes((2, "hit_rate", 2.0))), "hit_rate"),
    (graph_json(calibration=[]), "'calibration' must be an object"),
])
def test_malformed_graphs_are_clear_errors(tmp_path, graph, needle):
    path = tmp_path / GRAPH_FILE
    path.write_text(graph if isinstance(graph, str) else json.dumps(graph))
    with pytest.raises(GraphError, match=needle):
        load_graph(path)


def test_malformed_graph_refuses_spiffy(loaded, tmp_path):
    eng = engine_with_graph(loaded, tmp_path, graph_json(nodes=_nodes((0, "parent", 1), (1, "parent", 0))))
    with pytest.raises(ParamError, match="cycle"):
        eng.generate("What is 1 + 2?", "spiffy")
    big = engine_with_graph(loaded, tmp_path, graph_json(nodes=_nodes((0, "vocab_rank", 10**6))))
    with pytest.raises(ParamError, match="vocab_rank"):
        big.generate("What is 1 + 2?", "spiffy")


def test_the_shipped_graph_is_valid_and_used_by_default(shared_engine):
    """The shipped checkpoint's graph loads, and an engine on that checkpoint drafts from it (test_modes runs
    spiffy on it: equal to block_diffusion, with forwards saved)."""
    graph = load_graph(DEFAULT_CHECKPOINT / GRAPH_FILE)
    assert graph.nodes and {"prompts", "steps", "block_size", "threshold"} <= set(graph.calibration)
    rt = shared_engine.rt
    assert rt.loaded.shipped_file(GRAPH_FILE).resolve() == (DEFAULT_CHECKPOINT / GRAPH_FILE).resolve()
    assert graph_nodes(rt, 16, "spiffy") == graph.nodes[:16]


@pytest.mark.slow
def test_calibration_writes_a_valid_graph_spiffy_can_use(loaded, tmp_path, heldout_prompts):
    p = argparse.ArgumentParser()
    calibrate.add_arguments(p)
    args = p.parse_args(["--out", str(tmp_path), "--per-kind", "1", "--branches", "4", "--max-new-tokens", "12",
                         "--max-pos-rank", "3", "--max-vocab-rank", "2"])
    graph = calibrate.run(args)
    loaded_graph = load_graph(tmp_path / GRAPH_FILE)
    assert loaded_graph == graph and len(graph.nodes) == 4
    assert {"prompts", "steps", "block_size", "threshold"} <= set(graph.calibration)
    assert graph.calibration["prompts"] == len(TASK_FAMILIES) and graph.calibration["steps"] > 0
    assert all(0 <= n.hit_rate <= 1 and n.pos_rank < 3 and n.vocab_rank < 2 for n in graph.nodes)
    eng = engine_with_graph(loaded, tmp_path)
    prompt = heldout_prompts[0]
    assert eng.generate(prompt, "spiffy", GEN).output_ids == eng.generate(prompt, "block_diffusion", GEN).output_ids
