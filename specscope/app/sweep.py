"""Experiment-bench variants for Compare: `mode key=v1,v2 key2=w` lines, each expanded to one run per combination.
Pure functions, no I/O."""
from __future__ import annotations

from itertools import product
from typing import Any

Variant = tuple[str, dict[str, Any]]
EXAMPLE = "specfold delta=0,0.05,0.2\nisd n=2,4,8\nblock_diffusion threshold=0.5,0.9\nspiffy branches=1,3,7"


def parse_value(text: str, kind: str) -> Any:
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    if kind == "bool":
        return text.lower() in ("1", "true", "yes")
    return text


def parse_variants(text: str, specs: list[dict[str, Any]]) -> list[Variant]:
    """The runs a variants text asks for, in order; a ValueError names the line that is wrong."""
    by_mode = {m["name"]: {p["name"]: p for p in m["params"]} for m in specs}
    variants: list[Variant] = []
    for n, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        mode, assignments = words[0], words[1:]
        if mode not in by_mode:
            raise ValueError(f"line {n}: unknown mode {mode!r} (modes: {', '.join(by_mode)})")
        axes: list[list[tuple[str, Any]]] = []
        for word in assignments:
            key, _, values = word.partition("=")
            param = by_mode[mode].get(key)
            if param is None or not values:
                raise ValueError(f"line {n}: {word!r} is not key=value[,value…] with a parameter of {mode} "
                                 f"({', '.join(by_mode[mode])})")
            try:
                axes.append([(key, parse_value(v, param["type"])) for v in values.split(",") if v])
            except ValueError as exc:
                raise ValueError(f"line {n}: {word!r}: {exc}") from exc
        variants += [(mode, dict(combo)) for combo in product(*axes)]
    return variants
