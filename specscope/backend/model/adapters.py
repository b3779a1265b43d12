"""LoRA adapters in the PEFT layout: `adapter_config.json` + `adapter_model.safetensors`.

We read what the `peft` package writes (rank per module from the tensors, `lora_alpha` / `alpha_pattern`,
`use_rslora`) and write the same layout for our own adapters. Weight names are PEFT's
`base_model.model.<checkpoint module>.lora_A.weight`, mapped to our module paths by the model's family.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from specscope.backend.model.config import CheckpointError
from specscope.backend.model.families import BY_NAME, Family
from specscope.backend.model.transformer import LoRALinear, Transformer

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
TOKENS_KEY = re.compile(rf"{re.escape(PEFT_PREFIX)}(.+)\.token_adapter\.trainable_tokens_delta")
"""PEFT's trainable token rows (`trainable_token_indices`): the new values of chosen embedding rows."""
UNSUPPORTED = {"use_dora": "DoRA", "lora_bias": "LoRA bias", "modules_to_save": "extra trained modules",
               "fan_in_fan_out": "fan-in-fan-out weights", "layer_replication": "layer replication"}


def find_adapter(folder: Path) -> Path | None:
    """The adapter shipped with a checkpoint: the folder itself or exactly one subfolder (e.g. linear_spec_lora/)."""
    if (folder / CONFIG_FILE).exists():
        return folder
    found = sorted(p.parent for p in folder.glob(f"*/{CONFIG_FILE}"))
    if len(found) > 1:
        raise CheckpointError(f"{folder}: several adapters {[p.name for p in found]}; choose one explicitly")
    return found[0] if found else None


def _read_config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG_FILE
    if not path.exists():
        raise CheckpointError(f"{folder}: missing {CONFIG_FILE}")
    try:
        cfg = json.loads(path.read_bytes())
    except ValueError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    if cfg.get("peft_type", "LORA") != "LORA":
        raise CheckpointError(f"{path}: unsupported peft_type {cfg['peft_type']!r} (key 'peft_type'; only LORA)")
    for key, what in UNSUPPORTED.items():
        if cfg.get(key):
            raise CheckpointError(f"{path}: unsupported {what} (key {key!r} = {cfg[key]!r})")
    if cfg.get("bias", "none") != "none":
        raise CheckpointError(f"{path}: unsupported trained biases (key 'bias' = {cfg['bias']!r})")
    if "lora_alpha" not in cfg:
        raise CheckpointError(f"{path}: lacks key 'lora_alpha'")
    return cfg


def _read_weights(folder: Path, family: Family) -> tuple[dict[str, dict[str, Any]], dict[str, Tensor]]:
    """({our module path: {"lora_A": tensor, "lora_B": tensor, "peft_name": checkpoint module path}},
    {our embedding path: trainable token rows})."""
    path = folder / WEIGHTS_FILE
    if not path.exists():
        raise CheckpointError(f"{folder}: missing {WEIGHTS_FILE}")
    modules: dict[str, dict[str, Any]] = {}
    rows: dict[str, Tensor] = {}
    try:
        with safe_open(str(path), framework="pt") as sf:
            for key in sf.keys():
                tokens = TOKENS_KEY.fullmatch(key)
                if tokens is not None:
                    rows[family.our_key(tokens[1])] = sf.get_tensor(key)
                    continue
                m = re.fullmatch(rf"{re.escape(PEFT_PREFIX)}(.+)\.(lora_A|lora_B)(?:\.default)?\.weight", key)
                if m is None:
                    raise CheckpointError(f"{path}: not a LoRA weight (expected ...lora_A/lora_B.weight): {key}")
                entry = modules.setdefault(family.our_key(m[1]), {"peft_name": m[1]})
                entry[m[2]] = sf.get_tensor(key)
    except CheckpointError:
        raise
    except Exception as e:  # safetensors raises several types for a corrupt file
        raise CheckpointError(f"{path}: cannot read safetensors ({e})") from None
    return modules, rows


def _token_rows(cfg: dict[str, Any], rows: dict[str, Tensor], model: Transformer,
                folder: Path) -> list[tuple[Tensor, list[int], Tensor]]:
    """(embedding weight, row ids, new rows) for each trainable-token entry, checked against the model."""
    indices = cfg.get("trainable_token_indices") or {}
    if isinstance(indices, list):
        indices = {"embed_tokens": indices}
    out = []
    for name, values in rows.items():
        ids = next((v for k, v in indices.items() if name.endswith(k)), None)
        if ids is None or name != "embed_tokens":
            raise CheckpointError(f"{folder}: trainable tokens for {name} without matching trainable_token_indices "
                                  "on embed_tokens")
        weight = model.embed_tokens.weight
        if tuple(values.shape) != (len(ids), weight.shape[1]) or max(ids) >= weight.shape[0]:
            raise CheckpointError(f"{folder}: trainable token rows of shape {tuple(values.shape)} do not fit "
                                  f"{len(ids)} ids of an embedding {tuple(weight.shape)}")
        out.append((weight, list(ids), values))
    return out


def _pattern(patterns: dict[str, Any], name: str, default: Any) -> Any:
    """PEFT's rank_pattern / alpha_pattern lookup: the first key matching the module name's tail."""
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", name):
            return value
    return default


def load_adapter(model: Transformer, folder: str | Path, family: Family = BY_NAME["qwen3"]) -> None:
    """Attach a PEFT LoRA adapter to model (validated completely before the model is touched)."""
    folder = Path(folder)
    cfg = _read_config(folder)
    weights, rows = _read_weights(folder, family)
    if not weights:
        raise CheckpointError(f"{folder / WEIGHTS_FILE}: holds no LoRA weights")
    token_rows = _token_rows(cfg, rows, model, folder)
    layers = dict(model.named_modules())
    for name, entry in weights.items():
        module = layers.get(name)
        if not isinstance(module, LoRALinear):
            raise CheckpointError(f"{folder}: LoRA targets {entry['peft_name']}, not a projection of this model")
        for leaf in ("lora_A", "lora_B"):
            if leaf not in entry:
                raise CheckpointError(f"{folder}: {entry['peft_name']}.{leaf} is missing")
        rank = entry["lora_A"].shape[0]
        out_f, in_f = module.weight.shape
        for leaf, shape in (("lora_A", (rank, in_f)), ("lora_B", (out_f, rank))):
            if tuple(entry[leaf].shape) != shape:
                raise CheckpointError(f"{folder}: {entry['peft_name']}.{leaf} has shape "
                                      f"{tuple(entry[leaf].shape)}, the model implies {shape}")
    for name, entry in weights.items():
        module = layers[name]
        alpha = _pattern(cfg.get("alpha_pattern") or {}, entry["peft_name"], cfg["lora_alpha"])
        module.add_adapter(entry["lora_A"].shape[0], float(alpha), bool(cfg.get("use_rslora")))
        w = module.weight
        module.lora_A.data = entry["lora_A"].to(w.device, w.dtype)
        module.lora_B.data = entry["lora_B"].to(w.device, w.dtype)
    for weight, ids, values in token_rows:   # a tied LM head shares the rows, as PEFT ties them
        weight.data[ids] = values.to(weight.device, weight.dtype)


def save_adapter(model: Transformer, folder: str | Path, base_model: str | None = None,
                 tokens: dict[str, dict[int, Tensor]] | None = None) -> None:
    """Write model's adapters as PEFT would for the equivalent HF model (family qwen3-style `model.` names);
    `tokens` ({"embed_tokens": {id: row}}) adds trainable token rows (PEFT's trainable_token_indices)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    adapters = {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear) and m.lora_A is not None}
    if not adapters:
        raise ValueError("the model has no adapters to save")
    tensors, ranks, alphas = {}, {}, {}
    for name, m in adapters.items():
        peft_name = f"model.{name}"
        lora_a, lora_b = cast(Tensor, m.lora_A), cast(Tensor, m.lora_B)   # set: filtered above
        tensors[f"{PEFT_PREFIX}{peft_name}.lora_A.weight"] = lora_a.detach().contiguous()
        tensors[f"{PEFT_PREFIX}{peft_name}.lora_B.weight"] = lora_b.detach().contiguous()
        ranks[peft_name], alphas[peft_name] = lora_a.shape[0], m.lora_scale * lora_a.shape[0]
    rank, alpha = max(ranks.values()), max(alphas.values())
    config: dict[str, Any] = {
              "peft_type": "LORA", "base_model_name_or_path": base_model, "bias": "none", "use_rslora": False,
              "r": rank, "lora_alpha": alpha, "target_modules": sorted({n.rsplit(".", 1)[-1] for n in adapters}),
              "rank_pattern": {re.escape(n): r for n, r in ranks.items() if r != rank},
              "alpha_pattern": {re.escape(n): a for n, a in alphas.items() if a != alpha},
              "task_type": "CAUSAL_LM", "inference_mode": True}
    trainable: dict[str, list[int]] = {}
    for name, by_id in (tokens or {}).items():
        trainable[name] = sorted(by_id)
        tensors[f"{PEFT_PREFIX}model.{name}.token_adapter.trainable_tokens_delta"] = \
            torch.stack([by_id[i].detach() for i in trainable[name]]).contiguous()
    if trainable:
        config["trainable_token_indices"] = trainable
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=1))
