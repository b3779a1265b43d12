"""Training data: disjoint splits, reproducible batches, and the tri-stream mask / label layout."""
import json

import numpy as np
import pytest
import torch

from specscope.backend.model.tokenizer import MASK
from specscope.backend.train import tasks, tiny_data
from specscope.backend.train.card import model_card
from specscope.backend.train.domain import TASK_FAMILIES, code, numbers
from specscope.backend.train.domain.phrasing import expand, phrasing_split


def test_task_splits_are_disjoint_and_fixed_by_seed():
    sets = {s: tasks.task_set(s, 30) for s in tasks.SPLITS}
    prompts = {s: {t.prompt for t in ts} for s, ts in sets.items()}
    keys = {s: {t.key for t in ts} for s, ts in sets.items()}
    for a, b in (("train", "heldout"), ("train", "calibration"), ("heldout", "calibration")):
        assert not prompts[a] & prompts[b] and not keys[a] & keys[b]
    assert tasks.task_set("heldout", 5) == tasks.task_set("heldout", 5)
    for s, ts in sets.items():
        assert all(tasks.split_of(t.key) == s for t in ts)
    assert {t.kind for t in sets["heldout"]} >= set(tasks.REQUIRED)


def test_phrasing_split_is_honoured():
    for kind, family in TASK_FAMILIES.items():
        for variant in family.patterns:
            train = set(tasks.family_wordings(kind, variant, "train"))
            held = set(tasks.family_wordings(kind, variant, "heldout"))
            assert train and held and not train & held, (kind, variant)
    for s in ("train", "calibration"):
        assert all(t.phrasing == "train" and phrasing_split(t.wording) == "train" for t in tasks.task_set(s, 20))
    held = tasks.task_set("heldout", 20)
    assert all(phrasing_split(t.wording) == t.phrasing for t in held)
    for kind in TASK_FAMILIES:     # held-out prompts alternate trained and never-trained wordings
        assert {t.phrasing for t in held if t.kind == kind} == {"train", "heldout"}


def test_example_prompts_are_heldout_in_values_and_wording():
    examples = tasks.example_prompts(2)
    train = {t.prompt for t in tasks.task_set("train", 200)}
    for kind in tasks.REQUIRED:
        assert len(examples[kind]) == 2 and not set(examples[kind]) & train


def _spelled(words: str) -> int:
    """An independent reader of English number words."""
    small = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve "
                                        "thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split())}
    small |= {w: 10 * i for i, w in enumerate("_ _ twenty thirty forty fifty sixty seventy eighty ninety".split())
              if w != "_"}
    total, part = 0, 0
    for w in words.replace("-", " ").split():
        if w == "thousand":
            total, part = total + part * 1000, 0
        elif w == "hundred":
            part *= 100
        else:
            part += small[w]
    return total + part


def _check(t: tasks.Task) -> None:
    """The answer is right for the values in the key, and the values are in the prompt."""
    kind, _, rest = t.key.partition(":")
    if kind == "count":
        a, b = map(int, rest.split(":"))
        xs = [int(x) for x in t.answer.split()]
        assert xs[0] == a and xs[-1] == b and all(abs(y - x) == 1 for x, y in zip(xs, xs[1:], strict=False))
        assert len(xs) == abs(b - a) + 1 <= 40 and str(a) in t.prompt and str(b) in t.prompt
    elif kind == "table":
        n, k = map(int, rest.split(":"))
        lines = t.answer.split("\n")
        assert len(lines) == k <= 12 and str(n) in t.prompt
        for i, line in enumerate(lines, 1):
            x, y, p = line.replace(" x ", " ").replace(" = ", " ").split()
            assert (int(x), int(y), int(p)) == (n, i, n * i)
    elif kind == "add":
        a, b = map(int, rest.split(":"))
        lines = t.answer.split("\n")
        assert lines[-1] == f"So {a} + {b} = {a + b}" and str(a) in t.prompt and str(b) in t.prompt
        digits = "".join(line.split("write ")[1][0] for line in lines[:-1])
        assert int(digits[::-1]) == a + b              # the column working writes the sum's digits, ones first
    elif kind == "spell":
        assert _spelled(t.answer) == int(rest) and rest in t.prompt
    elif kind in ("sort", "reverse", "copy"):
        variant, xs = rest.split(":") if kind == "sort" else ("", rest)
        xs = xs.split()
        assert all(x in t.prompt for x in xs)
        if kind == "sort":
            key = int if variant.endswith("numbers") else str
            assert t.answer.split() == sorted(xs, key=key, reverse=variant.startswith("desc"))
        else:
            assert t.answer.split() == (xs[::-1] if kind == "reverse" else xs)
    elif kind == "json":
        pairs = [p.split("=") for p in rest.split()]
        assert json.loads(t.answer) == {k: int(v) if v.lstrip("-").isdigit() else v for k, v in pairs}
        assert all(k in t.prompt and v in t.prompt for k, v in pairs)
    elif kind == "pyfunc":
        op, name = rest.split(":")
        scope: dict = {}
        exec(t.answer, scope)                          # noqa: S102 - our own generated code
        fn = scope[name or op]
        assert (name or op) in t.prompt or not name
        if "(s)" in t.answer:
            assert isinstance(fn("  Hello World "), (str, int))
        elif "(xs, x)" in t.answer:
            assert fn([1, 2, 1], 1) == 2
        else:
            fn([3, 1, 4, 2])


@pytest.mark.parametrize("kind", list(TASK_FAMILIES))
def test_task_answers_are_checkable(kind):
    for split in tasks.SPLITS:
        for t in tasks.task_set(split, 40, kinds=(kind,)):
            _check(t)


def test_canonical_answers():
    assert [numbers.words(n) for n in (0, 13, 40, 105, 1205, 9999)] == [
        "zero", "thirteen", "forty", "one hundred five", "one thousand two hundred five",
        "nine thousand nine hundred ninety-nine"]
    assert numbers.working(95, 7).split("\n") == [
        "ones: 5 + 7 = 12, write 2 carry 1", "tens: 9 + 0 + 1 = 10, write 0 carry 1",
        "hundreds: carry 1, write 1", "So 95 + 7 = 102"]
    assert code.as_json([("name", "bob"), ("age", "7"), ("t", "-3")]) == '{"name": "bob", "age": 7, "t": -3}'
    scope: dict = {}
    exec(next(t.answer for t in tasks.task_set("train", 60, kinds=("pyfunc",)) if "product" in t.key
              and t.key.endswith(":")), scope)         # noqa: S102
    assert scope["product"]([2, 3, 4]) == 24


def test_expand_takes_every_alternative():
    assert expand("[Count|List] {a} [to|through|] {b}") == [
        "Count {a} to {b}", "Count {a} through {b}", "Count {a} {b}",
        "List {a} to {b}", "List {a} through {b}", "List {a} {b}"]


def test_model_card_names_every_family_with_examples():
    card = model_card()
    assert [f["name"] for f in card["families"]] == list(TASK_FAMILIES) and card["out_of_domain"]
    assert all(f["examples"] for f in card["families"])


def test_text_documents_split_by_name():
    names = {s: {n for n, _ in tiny_data.text_documents(s)} for s in ("train", "heldout")}
    assert names["heldout"] and names["train"] and not names["train"] & names["heldout"]


def test_tri_stream_mask_layout():
    t, bd, idlm = 8, 4, 2
    m = tiny_data.tri_stream_mask(t, bd, idlm)
    clean, noisy_bd, noisy_id = slice(0, t), slice(t, 2 * t), slice(2 * t, 3 * t)
    assert torch.equal(m[clean, clean], torch.ones(t, t, dtype=torch.bool).tril())
    assert not m[clean, t:].any()                                   # clean never sees noisy streams
    # bd position 5 (block 1) sees clean block 0 only, and all of its own block, bidirectionally
    assert m[t + 5, clean].tolist() == [True] * 4 + [False] * 4
    assert m[t + 5, noisy_bd].tolist() == [False] * 4 + [True] * 4
    assert not m[t + 5, noisy_id].any()
    # idlm position 5 (block 2 of size 2) sees clean 0..3, and causally its own block (4, 5)
    assert m[2 * t + 5, clean].tolist() == [True] * 4 + [False] * 4
    assert m[2 * t + 5, noisy_id].tolist() == [False] * 4 + [True, True, False, False]
    assert m[2 * t + 4, noisy_id].tolist() == [False] * 4 + [True, False, False, False]


@pytest.fixture(scope="module")
def tok(loaded):
    return loaded.tokenizer


def test_batches_are_a_pure_function_of_seed_and_step(tok):
    stream = np.arange(1000, dtype=np.uint16) % 500 + 10
    spec = tiny_data.BatchSpec(seq_len=64, batch_size=4)
    mask_id = tok.convert_tokens_to_ids(MASK)
    a = tiny_data.make_batch(tok, stream, spec, seed=3, step=7, mask_id=mask_id)
    b = tiny_data.make_batch(tok, stream, spec, seed=3, step=7, mask_id=mask_id)
    c = tiny_data.make_batch(tok, stream, spec, seed=3, step=8, mask_id=mask_id)
    assert torch.equal(a.ids, b.ids) and torch.equal(a.labels, b.labels) and torch.equal(a.mask, b.mask)
    assert not torch.equal(a.ids, c.ids)


def test_labels_are_shifted_and_bd_loss_only_on_masked_targets(tok):
    stream = np.arange(5000, dtype=np.uint16) % 1500 + 10
    spec = tiny_data.BatchSpec(seq_len=64, batch_size=6, task_fraction=0.5)
    mask_id = tok.convert_tokens_to_ids(MASK)
    b = tiny_data.make_batch(tok, stream, spec, seed=0, step=1, mask_id=mask_id)
    t = spec.seq_len
    x0, x_bd, x_id = b.ids[:, :t], b.ids[:, t:2 * t], b.ids[:, 2 * t:]
    assert torch.equal(b.labels[:, :t - 1], x0[:, 1:])              # AR: position i predicts x0[i+1]
    assert (x_id == mask_id).all()                                   # I-DLM stream is all MASK
    assert torch.equal(b.labels[:, 2 * t:3 * t - 1], x0[:, 1:])
    seeds = torch.arange(t) % b.bd_block == 0
    assert (x_bd[:, seeds] == x0[:, seeds]).all()                     # block seeds stay clean
    bd_labels = b.labels[:, t:2 * t]
    has = bd_labels != tiny_data.IGNORE
    target_masked = torch.zeros_like(has)
    target_masked[:, :-1] = x_bd[:, 1:] == mask_id
    assert (~has | target_masked).all()                               # loss only where the target is masked
    assert torch.equal(bd_labels[has], b.labels[:, :t][has])


@pytest.mark.parametrize("block", [8, 32])
def test_task_rows_pad_every_task_with_eos_to_the_block_end(tok, block):
    import random
    row = tiny_data.task_row(tok, random.Random(5), 512, block=block)
    user, eos = tok.convert_tokens_to_ids("<|user|>"), tok.convert_tokens_to_ids("<|eos|>")
    starts = [i for i, t in enumerate(row) if t == user]
    assert len(starts) > 3 and all(i % block == 0 for i in starts)
    assert all(row[i - 1] == eos for i in starts[1:])
    assert row.count(user) == row.count(tok.convert_tokens_to_ids("<|assistant|>"))   # no task cut short


def test_checkpoint_tasks_take_per_kind_from_the_shipped_file_and_answer_themselves(tmp_path):
    from specscope.backend.model.checkpoint import DEFAULT_CHECKPOINT
    shipped = tasks.checkpoint_tasks(DEFAULT_CHECKPOINT, 3)
    assert shipped is not None and len(shipped) == 3 * len({t.kind for t in shipped}) == 15
    for t in shipped:                       # the stop-9 templates, answers computed from the prompt
        body = t.prompt.split(": ", 1)[-1]
        if t.kind == "reverse":
            assert t.answer == " ".join(reversed(body.split()))
        elif t.kind == "sort":
            assert t.answer == " ".join(map(str, sorted(map(int, body.split()))))
        elif t.kind == "copy":
            assert t.answer == body
    assert tasks.checkpoint_tasks(tmp_path, 3) is None      # a checkpoint without its own tasks
