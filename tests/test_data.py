"""Training data: disjoint splits, reproducible batches, and the tri-stream mask / label layout."""
import numpy as np
import pytest
import torch

from backend.model import data, tasks
from backend.model.tokenizer import MASK


def test_task_splits_are_disjoint_and_fixed_by_seed():
    sets = {s: {t.prompt for t in tasks.task_set(s, 30)} for s in tasks.SPLITS}
    assert not sets["train"] & sets["heldout"]
    assert not sets["train"] & sets["calibration"]
    assert not sets["heldout"] & sets["calibration"]
    assert tasks.task_set("heldout", 5) == tasks.task_set("heldout", 5)
    for t in tasks.task_set("heldout", 5):
        assert tasks.split_of(t.prompt) == "heldout"


@pytest.mark.parametrize("kind", list(tasks.GENERATORS))
def test_task_answers_are_checkable(kind):
    for t in tasks.task_set("train", 10):
        if t.kind != kind:
            continue
        if kind == "add":
            a, b = t.prompt.removeprefix("What is ").removesuffix("?").split(" + ")
            assert int(t.answer) == int(a) + int(b)
        elif kind == "sort":
            xs = [int(x) for x in t.prompt.removeprefix("Sort: ").split()]
            assert t.answer == " ".join(map(str, sorted(xs)))
        elif kind == "reverse":
            assert t.answer.split() == t.prompt.removeprefix("Reverse: ").split()[::-1]


def test_text_documents_split_by_name():
    names = {s: {n for n, _ in data.text_documents(s)} for s in ("train", "heldout")}
    assert names["heldout"] and names["train"] and not names["train"] & names["heldout"]


def test_tri_stream_mask_layout():
    t, bd, idlm = 8, 4, 2
    m = data.tri_stream_mask(t, bd, idlm)
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
    spec = data.BatchSpec(seq_len=64, batch_size=4)
    mask_id = tok.convert_tokens_to_ids(MASK)
    a = data.make_batch(tok, stream, spec, seed=3, step=7, mask_id=mask_id)
    b = data.make_batch(tok, stream, spec, seed=3, step=7, mask_id=mask_id)
    c = data.make_batch(tok, stream, spec, seed=3, step=8, mask_id=mask_id)
    assert torch.equal(a.ids, b.ids) and torch.equal(a.labels, b.labels) and torch.equal(a.mask, b.mask)
    assert not torch.equal(a.ids, c.ids)


def test_labels_are_shifted_and_bd_loss_only_on_masked_targets(tok):
    stream = np.arange(5000, dtype=np.uint16) % 1500 + 10
    spec = data.BatchSpec(seq_len=64, batch_size=6, task_fraction=0.5)
    mask_id = tok.convert_tokens_to_ids(MASK)
    b = data.make_batch(tok, stream, spec, seed=0, step=1, mask_id=mask_id)
    t = spec.seq_len
    x0, x_bd, x_id = b.ids[:, :t], b.ids[:, t:2 * t], b.ids[:, 2 * t:]
    assert torch.equal(b.labels[:, :t - 1], x0[:, 1:])              # AR: position i predicts x0[i+1]
    assert (x_id == mask_id).all()                                   # I-DLM stream is all MASK
    assert torch.equal(b.labels[:, 2 * t:3 * t - 1], x0[:, 1:])
    seeds = torch.arange(t) % b.bd_block == 0
    assert (x_bd[:, seeds] == x0[:, seeds]).all()                     # block seeds stay clean
    bd_labels = b.labels[:, t:2 * t]
    has = bd_labels != data.IGNORE
    target_masked = torch.zeros_like(has)
    target_masked[:, :-1] = x_bd[:, 1:] == mask_id
    assert (~has | target_masked).all()                               # loss only where the target is masked
    assert torch.equal(bd_labels[has], b.labels[:, :t][has])


@pytest.mark.parametrize("block", [8, 32])
def test_task_rows_pad_every_task_with_eos_to_the_block_end(tok, block):
    import random
    row = data.task_row(tok, random.Random(5), 512, block=block)
    user, eos = tok.convert_tokens_to_ids("<|user|>"), tok.convert_tokens_to_ids("<|eos|>")
    starts = [i for i, t in enumerate(row) if t == user]
    assert len(starts) > 3 and all(i % block == 0 for i in starts)
    assert all(row[i - 1] == eos for i in starts[1:])
