"""Load and save checkpoints in the HF folder layout (config.json + safetensors + tokenizer [+ PEFT adapter]).

The same loader reads our shipped tiny model and real checkpoints of every family in families.py, sharded or
not. Weights are memory-mapped and handed to the model tensor by tensor (no second copy when the dtype
matches). Anything wrong with a folder raises CheckpointError with one message that names the problem.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specscope.backend.model.adapters import CONFIG_FILE, WEIGHTS_FILE, find_adapter, load_adapter
from specscope.backend.model.config import CheckpointError, ModelConfig
from specscope.backend.model.families import ADAPTER_SCOPES, Family, family_of
from specscope.backend.model.sampler_head import SAMPLER_FILE
from specscope.backend.model.tokenizer import ensure_chat_template, mask_token_id
from specscope.backend.model.transformer import ATTN_MODES, Transformer

DEFAULT_CHECKPOINT = Path(__file__).parent / "checkpoints" / "tiny"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The weight and KV dtypes a checkpoint loads in, by the name the commands take."""
ADAPTER_META = "specscope.json"
"""Beside a PEFT adapter: what PEFT's config cannot say, e.g. {"adapter_scope": "mask"}."""
CARD_FILE = "model_card.json"
"""Beside the weights: the model card (what the model was trained on and knows), served as /api/model_card."""


@dataclass
class LoadedModel:
    model: Transformer
    tokenizer: Any  # transformers.PreTrainedTokenizerFast
    mask_token_id: int | None
    eos_token_id: int | None
    name: str
    folder: Path | None = None   # where it was loaded from (mode artefacts such as draft_graph.json live here)
    family: str = "qwen3"
    weights_hash: str = ""       # short content hash of the weight (and adapter) files: runs record it
    logits_shifted: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(ATTN_MODES, True))
    """Per attention mode: True when position i's logits predict token i+1, False when they predict token i."""
    adapter_scope: str | None = None
    """Where the loaded adapter applies: None (no adapter), "draft" (draft/block passes: Nemotron linear-spec
    LoRA) or "mask" (MASK query positions only: I-DLM R-ISD; pass lora=(ids == mask_token_id))."""
    block_size: int | None = None  # the checkpoint's own block size (block_size / bd_size), if it has one
    stop_token_ids: list[int] = field(default_factory=list)
    adapter_dir: Path | None = None

    def shipped_file(self, name: str) -> Path | None:
        """A file shipped with the model (its card, a draft graph): beside the weights, else in the adapter's
        folder."""
        for where in (self.folder, self.adapter_dir):
            if where is not None and (where / name).is_file():
                return where / name
        return None


def read_config(folder: Path) -> dict[str, Any]:
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


def weight_files(folder: Path) -> list[Path]:
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


def _read_tensors(files: list[Path], family: Family) -> dict[str, torch.Tensor]:
    """Every weight under our module name, memory-mapped (nothing is read until a tensor is used)."""
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as sf:
                for key in sf.keys():
                    if "rotary_emb" not in key:
                        tensors[family.our_key(key)] = sf.get_tensor(key)
        except Exception as e:  # safetensors raises several types for a corrupt file
            raise CheckpointError(f"{f}: cannot read safetensors ({e})") from None
    return tensors


def _load_weights(model: Transformer, tensors: dict[str, torch.Tensor], folder: Path,
                  dtype: torch.dtype, device: str | torch.device) -> None:
    """Check names and shapes, then hand each tensor to the model (converted one at a time)."""
    expected = {k: v for k, v in model.state_dict().items() if "lora_" not in k}
    if model.lm_head is None:
        tensors.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing:
        raise CheckpointError(f"{folder}: weights missing from the checkpoint: {missing[:5]}"
                              f"{' ...' if len(missing) > 5 else ''}")
    if unexpected:
        raise CheckpointError(f"{folder}: unexpected weights (architecture mismatch?): {unexpected[:5]}")
    for k, t in expected.items():
        if tuple(tensors[k].shape) != tuple(t.shape):
            raise CheckpointError(f"{folder}: weight {k} has shape {tuple(tensors[k].shape)}, "
                                  f"config implies {tuple(t.shape)}")
    for k in expected:
        model.load_state_dict({k: tensors.pop(k).to(device=device, dtype=dtype)}, strict=False, assign=True)


def _adapter_dir(folder: Path, adapter: str | Path | bool | None) -> Path | None:
    """The adapter to attach: a given folder; None = the one shipped in the checkpoint folder, if any; False = none."""
    if adapter is False:
        return None
    return find_adapter(folder) if adapter is None or adapter is True else Path(adapter)


def load_model(folder: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
               adapter: str | Path | bool | None = None) -> Transformer:
    """The weights of a checkpoint folder as our Transformer (eval mode, no grad), with a PEFT adapter attached
    (see _adapter_dir)."""
    folder = Path(folder)
    d = read_config(folder)
    cfg = ModelConfig.from_hf_dict(d)
    family = cast(Family, family_of(d))   # ModelConfig.from_hf_dict refuses an unknown family
    with torch.device("meta"):  # adapters come only from PEFT files, never from a config's lora_rank
        model = Transformer(replace(cfg, lora_rank=0))
    _load_weights(model, _read_tensors(weight_files(folder), family), folder, dtype, device)
    adapter_dir = _adapter_dir(folder, adapter)
    if adapter_dir is not None:
        load_adapter(model, adapter_dir, family)
    return model.eval().requires_grad_(False)


def weights_hash(files: list[Path]) -> str:
    """12 hex digits of SHA-256 over the files' names and contents (streamed; a 16 GB checkpoint takes seconds)."""
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            h.update(hashlib.file_digest(fh, "sha256").digest())
    return h.hexdigest()[:12]


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
                    device: str | torch.device = "cpu", adapter: str | Path | bool | None = None,
                    adapter_scope: str | None = None, name: str | None = None) -> LoadedModel:
    """Model + tokenizer + the family's declarations. The mask id comes from config.json, else the tokenizer,
    else the family's default; the adapter scope from the argument, else the adapter's own declaration
    (specscope.json), else the family's, else "draft". `name` replaces the folder's name in the model's name
    (a model known by name: smollm2-135m)."""
    folder = Path(folder)
    if adapter_scope not in ADAPTER_SCOPES:
        raise CheckpointError(f"unknown adapter scope {adapter_scope!r}; expected one of {ADAPTER_SCOPES}")
    d = read_config(folder)
    adapter_dir = _adapter_dir(folder, adapter)
    model = load_model(folder, dtype, device, adapter_dir or False)
    family = cast(Family, family_of(d))   # ModelConfig.from_hf_dict refuses an unknown family
    tok = _load_tokenizer(folder)
    cfg = model.cfg
    mask_id = next((i for i in (cfg.mask_token_id, mask_token_id(tok), family.mask_token_id)
                    if i is not None and i < cfg.vocab_size), None)
    stops = [i for i in _stop_ids(folder, d, tok, family) if i < cfg.vocab_size]
    files = weight_files(folder) + ([adapter_dir / WEIGHTS_FILE, adapter_dir / CONFIG_FILE] if adapter_dir else [])
    files += [f for f in [adapter_dir / SAMPLER_FILE] if f.is_file()] if adapter_dir else []
    return LoadedModel(
        model, tok, mask_id, stops[0] if stops else None,
        (name or folder.name) + (f"+{adapter_dir.name}" if adapter_dir and adapter_dir != folder else ""), folder,
        family=family.name, weights_hash=weights_hash(files),
        logits_shifted={m: m not in family.unshifted for m in ATTN_MODES},
        adapter_scope=(adapter_scope or declared_scope(adapter_dir) or family.adapter_scope or "draft")
        if model.has_lora else None,
        block_size=family.block_size(d), stop_token_ids=stops, adapter_dir=adapter_dir)


def declared_scope(adapter_dir: Path | None) -> str | None:
    """The scope an adapter folder declares in specscope.json ({"adapter_scope": "mask"}), if any."""
    path = adapter_dir / ADAPTER_META if adapter_dir is not None else None
    if path is None or not path.exists():
        return None
    scope = json.loads(path.read_bytes()).get("adapter_scope")
    if scope not in ADAPTER_SCOPES:
        raise CheckpointError(f"{path}: unknown adapter_scope {scope!r}; expected one of {ADAPTER_SCOPES}")
    return scope


def _load_tokenizer(folder: Path) -> Any:
    if not any((folder / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise CheckpointError(f"{folder}: missing tokenizer (tokenizer.json / tokenizer_config.json)")
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    try:
        tok = cast(PreTrainedTokenizerFast, AutoTokenizer.from_pretrained(str(folder)))
    except Exception as e:
        raise CheckpointError(f"{folder}: cannot load the tokenizer ({e})") from None
    ensure_chat_template(tok, folder)
    return tok


def _stop_ids(folder: Path, d: dict[str, Any], tok: Any, family: Family) -> list[int]:
    """Stop tokens, the primary first: the family's, generation_config.json's, config.json's, the tokenizer's."""
    gen = folder / "generation_config.json"
    gen_eos = json.loads(gen.read_bytes()).get("eos_token_id") if gen.exists() else None
    ids: list[int] = []
    for value in (family.eos_token_id, gen_eos, d.get("eos_token_id"), tok.eos_token_id):
        for i in value if isinstance(value, list) else [value]:
            if isinstance(i, int) and i not in ids:
                ids.append(i)
    return ids
