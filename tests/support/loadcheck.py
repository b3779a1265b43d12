"""What loading a sharded checkpoint costs in resident memory: a random checkpoint in the HF sharded layout
(write_sharded), loaded in a fresh process (measure). tests/test_lazy_loading.py bounds the figures and
`python -m tools.loadcheck` prints them."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from specscope.backend.model.config import ModelConfig
from specscope.backend.model.transformer import Transformer

PROBE = """
import json, sys, torch
from specscope.backend.model.checkpoint import load_model
from specscope.backend.model.config import ModelConfig
from specscope.backend.model.transformer import Transformer
def rss(): return int(open('/proc/self/statm').read().split()[1]) * 4096
def hwm():  # VmHWM is this process's own peak (ru_maxrss would carry over the parent's through fork/exec)
    return next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmHWM'))
with torch.device("meta"):  # torch's one-time meta-device setup (~150 MB) is not the checkpoint's cost
    Transformer(ModelConfig(8, 8, 8, 1, 1, 1, 8))
base = rss()
model = load_model(sys.argv[1], dtype=getattr(torch, sys.argv[2]))
peak = hwm()
weights = sum(p.numel() * p.element_size() for p in model.parameters())
touched = [float(p.amax()) for p in model.parameters()]  # read every weight, no temporary copies
# the peak may still be the imports' own: peak - base over- (never under-) states what loading added
print(json.dumps({"weights_bytes": weights, "load_peak_bytes": peak - base, "resident_after_use_bytes": rss() - base,
                  "peak_bytes": hwm() - base}))
"""


def write_sharded(folder: Path, cfg: ModelConfig, shards: int, dtype: torch.dtype = torch.float16) -> int:
    """A random checkpoint in the HF sharded layout; returns the bytes of weights written."""
    torch.manual_seed(0)
    state = {f"model.{k}": v.to(dtype).contiguous() for k, v in Transformer(cfg).state_dict().items()}
    keys = sorted(state)
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = keys[i::shards]
        save_file({k: state[k] for k in part}, str(folder / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    return sum(t.numel() * t.element_size() for t in state.values())


def measure(folder: Path, dtype: str) -> dict[str, int]:
    """Load folder in a fresh interpreter (so nothing else is resident) and report its memory figures."""
    out = subprocess.run([sys.executable, "-c", PROBE, str(folder), dtype], check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def synthetic_config(layers: int, hidden: int = 1024) -> ModelConfig:
    return ModelConfig(vocab_size=8192, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                       num_attention_heads=hidden // 64, num_key_value_heads=hidden // 128, head_dim=64,
                       tie_word_embeddings=False)
