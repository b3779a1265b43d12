"""Load and save checkpoints in the HF folder layout (config.json + safetensors + tokenizer).

The same loader reads our shipped tiny model and real Qwen2 / Qwen3 (SDAR) / Llama / Mistral checkpoints.
Anything wrong with a folder raises CheckpointError with one message that names the problem.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from backend.model.config import CheckpointError, ModelConfig
from backend.model.transformer import LoRALinear, Transformer

DEFAULT_CHECKPOINT = Path(__file__).parent / "checkpoints" / "tiny"
LORA_FILE = "lora.safetensors"


@dataclass
class LoadedModel:
    model: Transformer
    tokenizer: Any  # transformers.PreTrainedTokenizerFast
    mask_token_id: int | None
    eos_token_id: int | None
    name: str
    folder: Path | None = None   # where it was loaded from (mode artefacts such as draft_graph.json live here)


def _read_config(folder: Path) -> dict[str, Any]:
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint folder {folder} does not exist")
    path = folder / "config.json"
    if not path.exists():
        raise CheckpointError(f"{folder}: missing config.json")
    try:
        d = json.loads(path.read_bytes())
    except ValueError as e:  # JSONDecodeError, or UnicodeDecodeError for binary garbage
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{path}: not a JSON object (got {type(d).__name__})")
    return d


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            shards = sorted(set(json.loads(index.read_bytes())["weight_map"].values()))
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise CheckpointError(f"{index}: not a valid shard index with a weight_map ({e!r})") from None
        missing = [s for s in shards if not (folder / s).exists()]
        if missing:
            raise CheckpointError(f"{folder}: shards listed in the index are missing: {missing}")
        return [folder / s for s in shards]
    if (folder / "model.safetensors").exists():
        return [folder / "model.safetensors"]
    raise CheckpointError(f"{folder}: missing model.safetensors (or a sharded index)")


def _read_tensors(files: list[Path]) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as sf:
                for key in sf.keys():
                    tensors[key.removeprefix("model.")] = sf.get_tensor(key)
        except CheckpointError:
            raise
        except Exception as e:  # safetensors raises several types for a corrupt file
            raise CheckpointError(f"{f}: cannot read safetensors ({e})") from None
    return tensors


def _load_weights(model: Transformer, tensors: dict[str, torch.Tensor], folder: Path) -> None:
    expected = {k: v for k, v in model.state_dict().items() if "lora_" not in k}
    if model.lm_head is None:
        tensors.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(k for k in set(tensors) - set(expected) if "rotary_emb" not in k)
    if missing:
        raise CheckpointError(f"{folder}: weights missing from the checkpoint: {missing[:5]}"
                              f"{' ...' if len(missing) > 5 else ''}")
    if unexpected:
        raise CheckpointError(f"{folder}: unexpected weights (architecture mismatch?): {unexpected[:5]}")
    for k, t in expected.items():
        if tuple(tensors[k].shape) != tuple(t.shape):
            raise CheckpointError(f"{folder}: weight {k} has shape {tuple(tensors[k].shape)}, "
                                  f"config implies {tuple(t.shape)}")
    model.load_state_dict({k: tensors[k] for k in expected}, strict=False)


def load_model(folder: str | Path, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu") -> Transformer:
    """The weights of a checkpoint folder as our Transformer (eval mode, no grad)."""
    folder = Path(folder)
    cfg = ModelConfig.from_hf_dict(_read_config(folder))
    tensors = _read_tensors(_weight_files(folder))
    model = Transformer(cfg)
    _load_weights(model, tensors, folder)
    if (folder / LORA_FILE).exists():
        load_lora(model, folder / LORA_FILE)
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)


def load_lora(model: Transformer, path: Path) -> None:
    """Attach a LoRA adapter saved by save_lora (rank and targets from its metadata)."""
    try:
        with safe_open(str(path), framework="pt") as sf:
            meta = sf.metadata() or {}
            tensors = {k: sf.get_tensor(k) for k in sf.keys()}
    except Exception as e:  # safetensors raises several types for a corrupt file
        raise CheckpointError(f"{path}: cannot read LoRA safetensors ({e})") from None
    rank, alpha = int(meta.get("rank", 0)), float(meta.get("alpha", 16.0))
    if rank <= 0:
        raise CheckpointError(f"{path}: LoRA file without a positive 'rank' in its metadata")
    extra = sorted(k for k in tensors if k.rsplit(".", 1)[-1] not in ("lora_A", "lora_B"))
    if extra:
        raise CheckpointError(f"{path}: not LoRA weights (only lora_A / lora_B allowed): {extra[:5]}")
    modules = dict(model.named_modules())
    targets = sorted({k.rsplit(".", 1)[0] for k in tensors})
    for name in targets:  # validate everything before touching the model
        module = modules.get(name)
        if not isinstance(module, LoRALinear):
            raise CheckpointError(f"{path}: LoRA targets unknown module {name}")
        out_f, in_f = module.weight.shape
        for leaf, shape in (("lora_A", (rank, in_f)), ("lora_B", (out_f, rank))):
            key = f"{name}.{leaf}"
            if key not in tensors:
                raise CheckpointError(f"{path}: {key} is missing")
            if tuple(tensors[key].shape) != shape:
                raise CheckpointError(f"{path}: {key} has shape {tuple(tensors[key].shape)}, "
                                      f"rank {rank} implies {shape}")
    for name in targets:
        modules[name].add_adapter(rank, alpha)
    model.load_state_dict(tensors, strict=False)


def save_lora(model: Transformer, path: Path, rank: int, alpha: float) -> None:
    tensors = {k: v.contiguous() for k, v in model.state_dict().items() if "lora_" in k}
    save_file(tensors, str(path), metadata={"rank": str(rank), "alpha": str(alpha)})


def save_checkpoint(model: Transformer, tokenizer: Any, folder: str | Path, meta: dict[str, Any]) -> None:
    """fp16 HF-layout checkpoint: config.json, model.safetensors, tokenizer files, training.json."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.{k}": v.detach().to(torch.float16).contiguous()
               for k, v in model.state_dict().items() if "lora_" not in k}
    if model.lm_head is not None:
        tensors["lm_head.weight"] = tensors.pop("model.lm_head.weight")
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(model.cfg.to_hf_dict(), indent=1))
    tokenizer.save_pretrained(folder)
    (folder / "training.json").write_text(json.dumps(meta, indent=1))


def load_checkpoint(folder: str | Path = DEFAULT_CHECKPOINT, dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu") -> LoadedModel:
    """Model + tokenizer + special ids; the mask id comes from the config, else the tokenizer."""
    folder = Path(folder)
    model = load_model(folder, dtype, device)
    if not any((folder / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise CheckpointError(f"{folder}: missing tokenizer (tokenizer.json / tokenizer_config.json)")
    from transformers import AutoTokenizer
    try:
        tok = AutoTokenizer.from_pretrained(str(folder))
    except Exception as e:
        raise CheckpointError(f"{folder}: cannot load the tokenizer ({e})") from None
    mask_id = model.cfg.mask_token_id
    if mask_id is None and tok.mask_token is not None:
        mask_id = tok.mask_token_id
    eos_id = model.cfg.eos_token_id if model.cfg.eos_token_id is not None else tok.eos_token_id
    return LoadedModel(model, tok, mask_id, eos_id, folder.name, folder)
