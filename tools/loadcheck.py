"""Measure what loading a sharded checkpoint costs in resident memory.

`python -m tools.loadcheck --layers 8 --shards 4 --dtype float16` writes a random sharded
checkpoint (model-0000i-of-0000n.safetensors + index) to a temporary folder, loads it in a fresh process and
prints the peak resident memory the load added, the resident memory once every weight has been used and the
overall peak, next to the size of the loaded weights. The checkpoint and the measurement are
tests/support/loadcheck.py's, whose figures tests/test_lazy_loading.py bounds.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from tests.support.loadcheck import measure, synthetic_config, write_sharded


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--dtype", nargs="+", default=["float16", "float32"], help="load dtypes to measure")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        on_disk = write_sharded(Path(tmp), synthetic_config(args.layers, args.hidden), args.shards)
        print(f"checkpoint: {on_disk / 2**20:.0f} MiB fp16 in {args.shards} shards")
        for dtype in args.dtype:
            m = measure(Path(tmp), dtype)
            w = m["weights_bytes"]
            print(f"load as {dtype}: weights {w / 2**20:.0f} MiB, load peak +{m['load_peak_bytes'] / 2**20:.0f} MiB "
                  f"({m['load_peak_bytes'] / w:.2f}x), resident after use +{m['resident_after_use_bytes'] / 2**20:.0f}"
                  f" MiB ({m['resident_after_use_bytes'] / w:.2f}x), overall peak +{m['peak_bytes'] / 2**20:.0f} MiB "
                  f"({m['peak_bytes'] / w:.2f}x)")


if __name__ == "__main__":
    main()
