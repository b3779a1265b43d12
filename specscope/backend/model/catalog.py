"""The models directory (`specscope serve --models DIR`): which subfolders hold a loadable checkpoint.

Scanning reads only config.json, the shard index and the safetensors headers, never the weights, so a
directory of 8B checkpoints lists in milliseconds. A folder that cannot be loaded is listed with the
loader's own error message instead of being hidden.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from safetensors import safe_open

from specscope.backend.model.adapters import find_adapter
from specscope.backend.model.checkpoint import read_config, weight_files
from specscope.backend.model.config import CheckpointError, ModelConfig
from specscope.backend.model.families import family_of
from specscope.backend.model.source import DEFAULT_MODEL, DONE_MARK, TINY, converted_folder, find_gguf, shipped_adapter


@dataclass
class CatalogEntry:
    name: str
    path: str
    loadable: bool
    family: str | None = None
    parameters: int | None = None      # from the safetensors headers
    dtype: str | None = None
    shards: int = 0
    adapter: str | None = None
    error: str | None = None
    builtin: bool = False               # a model known by name (tiny, smollm2-135m), not a models-directory folder
    mask_token: bool | None = None      # whether the modes that draft with MASK can run on it
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _header(files: list[Path]) -> tuple[int, str]:
    """Parameter count and dtype(s) of the weights, from the safetensors headers only."""
    count, dtypes = 0, set()
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for key in sf.keys():
                sl = sf.get_slice(key)
                n = 1
                for d in sl.get_shape():
                    n *= d
                count += n
                dtypes.add(sl.get_dtype())
    return count, "/".join(sorted(dtypes))


def describe(folder: Path) -> CatalogEntry:
    """One folder as a catalog entry; loadable=False with the CheckpointError message when it is not."""
    entry = CatalogEntry(folder.name, str(folder), loadable=False)
    try:
        d = read_config(folder)
        ModelConfig.from_hf_dict(d)
        files = weight_files(folder)
        family = family_of(d)
        entry.family = family.name if family is not None else None
        entry.parameters, entry.dtype = _header(files)
        entry.shards = len(files)
        adapter = find_adapter(folder)
        entry.adapter = adapter.name if adapter else None
        entry.mask_token = any(i is not None for i in (d.get("mask_token_id"), family and family.mask_token_id))
        entry.loadable = True
    except CheckpointError as e:
        entry.error = str(e)
    except (OSError, ValueError, json.JSONDecodeError) as e:  # unreadable headers
        entry.error = f"{folder}: {e}"
    return entry


def builtin() -> list[CatalogEntry]:
    """The models known by name: the default chat model (described once converted) and the tiny test model."""
    try:
        gguf = find_gguf()
    except CheckpointError as e:
        smollm = CatalogEntry(DEFAULT_MODEL, DEFAULT_MODEL, loadable=False, error=str(e))
    else:
        folder = converted_folder(gguf)
        if (folder / DONE_MARK).exists():
            smollm = describe(folder)
        else:
            smollm = CatalogEntry(DEFAULT_MODEL, str(gguf), loadable=True, family="llama", mask_token=True,
                                  note="converted from the GGUF on first use (~1 min)")
        adapter = shipped_adapter()
        smollm.adapter = adapter.name if adapter else None
    tiny = describe(TINY)
    for entry in (smollm, tiny):
        entry.builtin = True
    smollm.name = DEFAULT_MODEL   # the converted folder's own name is smollm2-135m-instruct
    return [smollm, tiny]


def scan(models_dir: str | Path) -> list[CatalogEntry]:
    """Every subfolder of models_dir that has a config.json, sorted by name."""
    root = Path(models_dir)
    if not root.is_dir():
        raise CheckpointError(f"models directory {root} does not exist")
    return [describe(p) for p in sorted(root.iterdir()) if (p / "config.json").exists()]
