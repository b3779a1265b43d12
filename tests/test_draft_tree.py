"""Tree drafts: the seed row's likeliest first tokens, each followed by a chain, verified in one forward under a tree
mask; the longest confirmed path wins. The tree holds the chain as its first branch, so it accepts at least what
the chain does, and other branches do win rounds; the tokens stay `ar`'s (test_modes checks every held-out prompt)."""
import torch

from specscope.backend.engine.cost_curve import FLAT, CostCurve
from specscope.backend.engine.draft_tree import ROOT, DraftTree, tree_mask
from specscope.backend.tracing import RecordingTracer

# two branches: a (0.6) -> b (0.3) -> c (0.15); x (0.3) -> y (0.27)
TREE = DraftTree(tokens=[10, 11, 12, 20, 21], parents=[ROOT, 0, 1, ROOT, 3], depths=[1, 2, 3, 1, 2],
                 chances=[0.6, 0.3, 0.15, 0.3, 0.27], branches=[0, 0, 0, 1, 1])


def test_the_path_follows_the_verifier_from_the_seed() -> None:
    # verifier[row]: the token after row `row` (row 0 the seed, node i row i + 1)
    assert TREE.path([20, 0, 0, 0, 21, 7]) == [3, 4]         # the second branch, to its leaf
    assert TREE.path([10, 11, 99, 0, 0, 0]) == [0, 1]        # first branch, cut after b
    assert TREE.path([42, 0, 0, 0, 0, 0]) == []              # nothing: the seed's row gives the bonus


def test_a_tree_row_sees_its_ancestors_and_the_prefix_only() -> None:
    mask = tree_mask(TREE.rows(), prefix=3)[0, 0]
    assert mask[:, :3].all()
    sees = mask[:, 3:]
    assert sees[3].tolist() == [True, True, True, True, False, False]    # c: seed, a, b, itself
    assert sees[5].tolist() == [True, False, False, False, True, True]   # y: seed, x, itself
    assert torch.equal(sees, sees & torch.ones(6, 6, dtype=torch.bool).tril())


def test_the_kept_nodes_are_the_likeliest_and_pay_for_their_rows() -> None:
    best = TREE.best(3)
    assert best.tokens == [10, 11, 20] and best.parents == [ROOT, 0, ROOT]
    assert TREE.paying(lambda n: FLAT.at(1 + n)).tokens == TREE.tokens          # free rows: the whole tree
    assert TREE.paying(lambda n: 1.0 + n).tokens == []                          # a row a decode step: none
    middling = CostCurve({1: 1.0, 2: 1.3, 4: 2.5, 8: 5.0})     # one row more pays, two do not
    assert TREE.paying(lambda n: middling.at(1 + n)).tokens == [10]


def test_tree_drafts_accept_at_least_the_chain_and_other_branches_win(shared_engine, heldout_prompts) -> None:
    params = {"max_new_tokens": 32, "verify": "fixed", "block_size": 6}
    chain_accepted, tree_accepted, winners = [], [], set()
    for prompt in heldout_prompts[::4]:
        chain = shared_engine.generate(prompt, "linear_spec", params)
        tracer = RecordingTracer()
        tree = shared_engine.generate(prompt, "linear_spec", {**params, "branches": 3}, tracer=tracer)
        assert tree.output_ids == chain.output_ids
        chain_accepted.append(chain.metrics["accept_len_mean"])
        tree_accepted.append(tree.metrics["accept_len_mean"])
        for r in (e for e in tracer.events if e["type"] == "round" and "tree" in (e.get("extra") or {})):
            shape = r["extra"]["tree"]
            if "bonus" not in r["states"]:
                continue        # the view ends at an emitted EOS
            assert sum(shape["branch_rows"]) == len(shape["parents"]) == len(r["tokens"]) - 2
            kept = [t for t, s in zip(r["tokens"], r["states"], strict=True) if s in ("accepted", "bonus")]
            assert kept == r["committed"]
            winners.add(shape["won"])
    assert sum(tree_accepted) >= sum(chain_accepted)
    assert winners - {0, None}, winners
