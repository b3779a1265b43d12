"""Sharded checkpoints are memory-mapped: loading at the file's dtype reads (almost) nothing, and neither that
nor a dtype conversion ever holds twice the weights (measured in a fresh process by support/loadcheck.py)."""
from __future__ import annotations

import pytest
from support.loadcheck import measure, synthetic_config, write_sharded


@pytest.mark.extended
def test_sharded_load_is_lazy_and_under_twice_the_weights(tmp_path):
    cfg = synthetic_config(layers=2)
    written = write_sharded(tmp_path, cfg, shards=3)
    same = measure(tmp_path, "float16")
    assert same["weights_bytes"] == written
    assert same["load_peak_bytes"] < 0.25 * written        # mapped, not read
    assert same["peak_bytes"] < 1.5 * written             # using every weight faults the pages in once
    wide = measure(tmp_path, "float32")
    assert wide["weights_bytes"] == 2 * written
    assert wide["peak_bytes"] < 1.5 * wide["weights_bytes"]  # fp16 pages + fp32 copies, never two full copies

