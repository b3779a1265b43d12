"""The slot allocator: property-based sequences of alloc/free keep the pool consistent."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.engine.kv import KVError, KVPool, OutOfSlots
from backend.model.config import ModelConfig

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
