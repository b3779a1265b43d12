"""`specscope bench`: the peer baseline, the ratios and the variants of one small run."""
import argparse
import json
from pathlib import Path

import pytest
import torch

from specscope.backend.engine.cost_curve import ROWS
from specscope.lab import bench
from specscope.lab.bench import headline, write_summary
from specscope.lab.bench_compare import compare, load


def test_parse_variant_types_values():
    assert bench.parse_variant("specfold:ffn_gate=strict,delta=0.2") == ("specfold", {"ffn_gate": "strict",
                                                                                      "delta": 0.2})
    assert bench.parse_variant("ar") == ("ar", {})


@pytest.mark.slow   # a whole bench run: every mode, twice, and the verify-rows table
def test_small_bench_reports_peer_ratios_verify_and_variants(tmp_path):
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args = p.parse_args(["--model", "tiny", "--cost-curve", "flat", "--modes", "ar,spiffy,specfold", "--per-kind", "1",
                         "--repeats", "1", "--max-new-tokens", "8", "--clock", "cpu",
                         "--variant", "specfold:ffn_gate=strict,delta=0", "--out", str(tmp_path)])
    rows = bench.run(args)
    doc = json.loads((tmp_path / "bench.json").read_text())
    peer = doc["peer"]
    assert peer["same_as_ar"] == 1.0            # HF generate, greedy, same checkpoint: ar's tokens
    assert set(rows) == {"ar", "spiffy", "specfold", "specfold:ffn_gate=strict,delta=0"}
    for row in rows.values():
        assert abs(row["vs_peer"] - row["tok_per_s"] / peer["tok_per_s"]) < 1e-9
        assert abs(row["speedup_vs_ar"] - row["tok_per_s"] / rows["ar"]["tok_per_s"]) < 1e-9
        assert row["tracing_ratio"] > 0
        assert 0 < sum(v for k, v in row["time_split"].items() if k != "other") <= 1
    assert set(rows["ar"]["time_split"]) == {"prefill", "decode", "other"}
    assert rows["ar"]["greedy_share"] == 1.0 and rows["ar"]["answer_nll"] > 0   # the model's own pick, every token
    assert all(0 <= row["greedy_share"] <= 1 for row in rows.values())
    assert "verify" in rows["specfold"]["time_split"]
    strict = rows["specfold:ffn_gate=strict,delta=0"]
    assert strict["params"]["ffn_gate"] == "strict" and strict["reference"] == "spiffy"
    assert strict["same_as_reference"] == 1.0   # strict at δ=0 is lossless against spiffy
    assert 0 < rows["specfold"]["mode_metrics"]["fold_ratio"] <= 1 and rows["spiffy"]["fold_ratio"] is None
    assert rows["specfold"]["verify_speedup_vs_reference"] > 0
    assert "transformers generate (peer)" in (tmp_path / "bench.md").read_text()
    for row in rows.values():   # the speedup explained: three measured factors against ar, and the measured ratio
        found = row["speedup_explained"]
        assert found["product"] == pytest.approx(found["tpf"] * found["row_cost"] * found["forward_share"])
        assert found["measured"] == row["speedup_vs_ar"] and 0 < row["forward_share"] <= 1
    assert "The speedup explained" in (tmp_path / "bench.md").read_text()
    cost = doc["verify_rows"]
    assert list(cost["ms"]) == [str(rows) for rows in ROWS] and all(ms > 0 for ms in cost["ms"].values())
    assert cost["vs_one_row"]["1"] == 1.0 and "Verify forward of k rows" in (tmp_path / "bench.md").read_text()


def test_the_lossless_check_covers_each_variant_and_judges_the_drafter_at_its_own_parameters(tmp_path):
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args = p.parse_args(["--model", "tiny", "--cost-curve", "flat", "--modes", "linear_spec", "--per-kind", "2",
                         "--max-new-tokens", "12", "--lossless", "--variant", "linear_spec:verify=fixed",
                         "--variant", "linear_spec:verify=fixed,branches=3", "--out", str(tmp_path)])
    bench.run(args)
    rows = {r["row"]: r for r in json.loads((tmp_path / "lossless.json").read_text())["rows"]}
    assert set(rows) == {"linear_spec", "linear_spec:verify=fixed", "linear_spec:verify=fixed,branches=3"}
    assert all(r["identical"] == r["prompts"] > 0 for r in rows.values())
    assert rows["linear_spec"]["drafter_works"] is None           # cost-aware: its drafter is judged where fixed
    assert rows["linear_spec:verify=fixed"]["drafter_works"] is True
    assert rows["linear_spec:verify=fixed,branches=3"]["drafter_works"] is True


def test_a_lossy_modes_agreement_is_the_share_of_the_references_tokens_before_the_first_difference():
    ar = {"mode": "ar", "outputs": [[1, 2, 3, 4], [5, 6]], "tok_per_s": 10.0}
    block = {"mode": "block_diffusion", "outputs": [[1, 2, 9, 4], [5, 6]], "tok_per_s": 5.0}
    short = {"mode": "block_diffusion", "outputs": [[1], [5, 6, 7]], "tok_per_s": 5.0}   # longer: stops later
    rows = {"ar": ar, "block_diffusion": block, "block_diffusion:threshold=0.3": short}
    bench.compare_to_references(rows, None)
    assert ar["same_as_reference"] == ar["agreed_prefix"] == 1.0
    assert block["same_as_reference"] == 0.5 and block["agreed_prefix"] == (2 / 4 + 1) / 2
    assert short["same_as_reference"] == 0.0 and short["agreed_prefix"] == (1 / 4 + 1) / 2
    assert block["speedup_vs_ar"] == 0.5


def test_verify_rows_leaves_the_kv_pool_as_it_found_it(loaded):
    """Every slot a timed forward takes (the prompt's and the rows') is freed again."""
    from specscope.backend.engine.engine import Engine
    from specscope.lab.verify_rows import verify_rows

    engine = Engine(loaded, num_slots=512)
    free = engine.rt.pool.free_count
    figures = verify_rows(engine, "Copy: a b c", repeats=2, rows=(1, 3))
    assert engine.rt.pool.free_count == free
    assert set(figures["ms"]) == {1, 3} and figures["prefix"] > 3


def test_bench_compare_flags_a_token_change_and_takes_medians(tmp_path):
    """`specscope bench-diff`: the same tokens only when every run of both sets agrees; tok/s as medians per set."""
    def report(name: str, tok_per_s: float, outputs: list[list[int]]) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        rows = {"ar": {"tok_per_s": tok_per_s, "outputs": outputs}, "isd": {"tok_per_s": 1.0, "outputs": [[1]]}}
        (folder / "bench.json").write_text(json.dumps({"meta": {"commit": name}, "modes": rows}))
        return folder

    before = load([report("b1", 10.0, [[1, 2]]), report("b2", 30.0, [[1, 2]]), report("b3", 20.0, [[1, 2]])])
    after = load([report("a1", 40.0, [[1, 2]]), report("a2", 40.0, [[1, 3]])])
    rows = {r["mode"]: r for r in compare(before, after)}
    assert rows["ar"]["same_tokens"] is False and rows["isd"]["same_tokens"] is True
    assert rows["ar"]["before_tok_per_s"] == 20.0 and rows["ar"]["ratio"] == 2.0


@pytest.mark.parametrize("chunk", [16, 3])
def test_answer_fit_rates_an_answer_as_transformers_does(shared_engine, heldout_prompts, monkeypatch, chunk):
    """ar's greedy answer is the model's own pick at every token; for it and for an answer with one token changed,
    the share of picks and the summed NLL are transformers' teacher-forced figures on the same checkpoint (the
    answer scored in one chunk, or in chunks of 3 rows)."""
    from transformers import AutoModelForCausalLM

    from specscope.backend.engine import answer_fit as fit_module
    from specscope.backend.engine.answer_fit import answer_fit, summed
    from specscope.backend.model.checkpoint import DEFAULT_CHECKPOINT

    monkeypatch.setattr(fit_module, "CHUNK", chunk)
    hf = AutoModelForCausalLM.from_pretrained(DEFAULT_CHECKPOINT, dtype=torch.float32).eval()
    answers = {p: shared_engine.generate(p, "ar", {"max_new_tokens": 12}).output_ids for p in heldout_prompts[::4]}
    prompt, greedy = max(answers.items(), key=lambda kv: len(kv[1]))
    assert len(greedy) >= 4
    changed = [(greedy[0] + 5) % hf.config.vocab_size, *greedy[1:]]
    prompt_ids = shared_engine.encode_prompt(prompt, raw=False)
    fits = []
    for answer in (greedy, changed):
        with torch.no_grad():
            logits = hf(torch.tensor([prompt_ids + answer])).logits[0, len(prompt_ids) - 1:-1]
        target = torch.tensor(answer)
        fit = answer_fit(shared_engine, prompt_ids, answer)
        assert fit.answer == answer and fit.picks == logits.argmax(-1).tolist()
        nll = torch.nn.functional.cross_entropy(logits, target, reduction="none")
        assert torch.allclose(torch.tensor(fit.nll), nll, atol=1e-4)
        fits.append(fit)
    assert fits[0].greedy == len(greedy) and fits[1].greedy < len(changed) and sum(fits[1].nll) > sum(fits[0].nll)
    assert fits[1].summary()["greedy_share"] == fits[1].greedy / len(changed)
    both = summed(fits)
    assert both["greedy_share"] == (fits[0].greedy + fits[1].greedy) / (2 * len(greedy))
    assert summed([answer_fit(shared_engine, prompt_ids, [])]) == {"greedy_share": None, "nll": None}


def test_the_readme_bench_table_is_the_one_bench_writes(tmp_path):
    """The README's headline table is `specscope bench --summary docs/bench/bench.json`, word for word, and --into
    rewrites only the section between its markers."""
    root = Path(__file__).resolve().parents[1]
    table = headline(json.loads((root / "docs" / "bench" / "bench.json").read_text()))
    readme = (root / "README.md").read_text()
    assert table in readme
    stale = tmp_path / "README.md"
    stale.write_text(readme.replace(table, "| an old table |\n"))
    write_summary(root / "docs" / "bench" / "bench.json", stale)
    assert stale.read_text() == readme
