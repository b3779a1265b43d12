"""How many KV slots fit: the pool size used when --slots is not given."""
from __future__ import annotations

import torch

from specscope.backend.model.config import ModelConfig

DEFAULT_FRACTION = 0.5   # of the memory free after the weights are loaded


def slot_bytes(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """K and V of one position across all layers."""
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * torch.finfo(dtype).bits // 8


def free_bytes(device: str | torch.device) -> int:
    """Free device memory (CUDA) or available host memory (/proc/meminfo MemAvailable)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable"))


def auto_slots(cfg: ModelConfig, dtype: torch.dtype, device: str | torch.device,
               fraction: float = DEFAULT_FRACTION, at_most: int = 1 << 20) -> int:
    """Slots filling `fraction` of the free memory, capped at `at_most` (the engine refuses a request whose
    worst case does not fit, naming the pool size)."""
    return max(1, min(int(free_bytes(device) * fraction) // slot_bytes(cfg, dtype), at_most))
