"""The mode registry: every module in this package registers its mode on import."""
from __future__ import annotations

import functools
import importlib
import pkgutil

from specscope.backend.engine.modes.base import Mode
from specscope.backend.engine.params import COMMON_PARAMS, Param, ParamError

REGISTRY: dict[str, type[Mode]] = {}


def register(cls: type[Mode]) -> type[Mode]:
    if cls.name in REGISTRY:
        raise ValueError(f"mode {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls


def get_mode(name: str) -> Mode:
    _load_all()
    if name not in REGISTRY:
        raise ParamError(f"unknown mode {name!r}; available: {sorted(REGISTRY)}")
    return REGISTRY[name]()


def mode_names() -> list[str]:
    _load_all()
    return sorted(REGISTRY)


def param_specs(mode: Mode) -> tuple[Param, ...]:
    return COMMON_PARAMS + mode.params


def describe_modes(mask_token: bool = True) -> list[dict]:
    """Registry + parameter schema, as served by GET /api/modes, with whether a model with (or without) a mask
    token can run each mode."""
    _load_all()
    return [{"name": name, "summary": cls.summary, "nfe": cls.nfe_note, "explain": cls.explain, "color": cls.color,
             "exact": cls.exact, "lossless_vs": cls.lossless_vs, "lossless_params": cls.lossless_params,
             "lossy": lossy(name), "picked": dict(cls.picked), "draft_param": cls.draft_param,
             "columns": [c.schema() for c in cls.columns],
             "available": mask_token or not cls.needs_mask,
             "unavailable": None if mask_token or not cls.needs_mask else "the model has no mask token",
             "params": [p.schema() for p in param_specs(cls())]} for name, cls in sorted(REGISTRY.items())]


def baseline() -> str:
    """The mode every speedup is measured against and a request that names none runs: the one exact mode (its
    greedy output is the model's own greedy decode)."""
    _load_all()
    exact = [name for name, cls in sorted(REGISTRY.items()) if cls.exact]
    if len(exact) != 1:
        raise RuntimeError(f"the registry needs exactly one exact mode, has {exact}")
    return exact[0]


def picks(picker: str) -> list[str]:
    """The modes `picker` (base.PICKERS) chooses by default, in its order of preference."""
    _load_all()
    return sorted((name for name, cls in REGISTRY.items() if picker in cls.picked),
                  key=lambda name: REGISTRY[name].picked[picker])


def lossy(name: str) -> bool:
    """Whether a mode's greedy output may differ from the model's own greedy decode: it is not exact, and its
    lossless claims do not lead back to an exact mode."""
    cls = REGISTRY[name]
    return not cls.exact and (cls.lossless_vs is None or lossy(cls.lossless_vs))


@functools.cache
def _load_all() -> None:
    for info in pkgutil.iter_modules(__path__):
        if info.name != "base":
            importlib.import_module(f"{__name__}.{info.name}")
