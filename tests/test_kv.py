"""The slot allocator: property-based sequences of alloc/free keep the pool consistent; its memory costs nothing
until written."""
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specscope.backend.engine.kv import KVError, KVPool, OutOfSlots
from specscope.backend.model.config import ModelConfig

CFG = ModelConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=4)

ops = st.lists(st.tuples(st.sampled_from(["alloc", "free"]), st.sampled_from(["a", "b", "c"]),
                         st.integers(0, 12)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_random_alloc_free_sequences_keep_invariants(sequence):
    pool = KVPool(CFG, 24)
    held: dict[str, list[int]] = {"a": [], "b": [], "c": []}
    for op, owner, n in sequence:
        if op == "alloc":
            before = pool.free_count
            if n > before:
                with pytest.raises(OutOfSlots):
                    pool.alloc(owner, n)
                assert pool.free_count == before          # a refused alloc changes nothing
            else:
                held[owner] += pool.alloc(owner, n)
        else:
            k = min(n, len(held[owner]))
            pool.free(owner, held[owner][:k])
            held[owner] = held[owner][k:]
        pool.check()
        all_held = [s for v in held.values() for s in v]
        assert len(all_held) == len(set(all_held)) == pool.used
        for o, slots in held.items():
            assert pool.owned_by(o) == sorted(slots)
    assert pool.peak >= pool.used


def test_double_free_and_foreign_free_are_refused():
    pool = KVPool(CFG, 8)
    a = pool.alloc("a", 3)
    b = pool.alloc("b", 2)
    with pytest.raises(KVError, match="owned by 'b'"):
        pool.free("a", b[:1])
    pool.free("a", a[:1])
    with pytest.raises(KVError, match="owned by None"):
        pool.free("a", a[:1])
    with pytest.raises(KVError, match="twice"):
        pool.free("a", [a[1], a[1]])
    pool.check()
    assert pool.used == 4


def test_out_of_slots_message_names_the_request():
    pool = KVPool(CFG, 4)
    with pytest.raises(OutOfSlots, match="r1 asked for 5 slots, 4 of 4 free"):
        pool.alloc("r1", 5)


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux's /proc")
def test_a_pool_is_zeros_that_cost_memory_only_where_written():
    """The CPU pool's memory is the kernel's zero pages, mapped as slots are written: a 2 GiB pool adds next to
    nothing to the process until used, reads as zeros, and keeps what is written."""
    wide = ModelConfig(vocab_size=16, hidden_size=64, intermediate_size=16, num_hidden_layers=16,
                       num_attention_heads=4, num_key_value_heads=4, head_dim=64)
    before = resident_bytes()
    pool = KVPool(wide, 1 << 16)   # 2 x 16 layers x 65,536 slots x 4 heads x 64 x 4 bytes = 2 GiB
    k, v = pool.memory.k, pool.memory.v
    assert k.numel() * k.element_size() + v.numel() * v.element_size() == 2 << 30
    assert resident_bytes() - before < 64 << 20
    assert not k[:, 1000:1010].any() and not v[-1, -5:].any()
    k[3, 777] = 1.5
    assert float(k[3, 777].sum()) == 1.5 * 4 * 64 and float(k.sum(dtype=torch.float64)) == 1.5 * 4 * 64
    assert k.is_contiguous() and k.data_ptr() % 64 == 0
