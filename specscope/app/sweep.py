"""Experiment-bench variants for Compare: `mode key=v1,v2 key2=w` lines, each expanded to one run per combination.
Pure functions, no I/O."""
from __future__ import annotations

from itertools import product
from typing import Any

Variant = tuple[str, dict[str, Any]]
EXAMPLE = "MODE KEY=V1,V2,… (one line per sweep)"
"""The variants box's placeholder until the served modes are known (`example`)."""


def example(specs: list[dict[str, Any]], lines: int = 4) -> str:
    """A variants text for the served modes (GET /api/modes): a line for each of the first `lines` modes with a
    number parameter of its own (one not every mode has), sweeping it over its minimum, default and maximum."""
    common = set.intersection(*({p["name"] for p in m["params"]} for m in specs)) if specs else set()
    out = []
    for m in specs:
        own = [p for p in m["params"] if p["name"] not in common and p["type"] in ("int", "float")
               and p.get("min") is not None and p.get("max") is not None]
        if own and m.get("available", True):
            p = own[0]
            values = dict.fromkeys(str(v) for v in (p["min"], p["default"], p["max"]))
            out.append(f"{m['name']} {p['name']}={','.join(values)}")
    return "\n".join(out[:lines]) or EXAMPLE


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
