"""What the UI knows of the decoding modes: each one's own declarations, as the backend's registry serves them
(GET /api/modes, engine/modes/): its colour, its lossless claim, whether it is the exact baseline, the pickers that
choose it by default, its own metric columns, what a round means in it. The UI names no mode itself; a mode it has
not heard of (a run of a mode the backend no longer has) is drawn in a neutral colour. Pure, no I/O."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specscope.backend.engine.lossless import Claim

UNDECLARED = "#0f172a"
"""The colour of a mode the registry does not declare."""


@dataclass(frozen=True)
class ModeBook:
    """The served modes' declarations (GET /api/modes), by name."""
    specs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @classmethod
    def of(cls, specs: Iterable[Mapping[str, Any]]) -> ModeBook:
        return cls({m["name"]: m for m in specs})

    def names(self, available_only: bool = True) -> list[str]:
        """The modes in the registry's order; only those the served model can run, unless asked for all."""
        return [name for name, m in self.specs.items() if m.get("available", True) or not available_only]

    def color(self, mode: str) -> str:
        """The mode's colour, the same in every comparison."""
        return str((self.specs.get(mode) or {}).get("color") or UNDECLARED)

    def explain(self, mode: str) -> str:
        """What a round, "accepted" and "committed" mean in the mode."""
        return str((self.specs.get(mode) or {}).get("explain") or "")

    @property
    def baseline(self) -> str | None:
        """The exact mode (the model's own greedy decode) that speedups are measured against."""
        return next((name for name, m in self.specs.items() if m.get("exact")), None)

    @property
    def claims(self) -> dict[str, Claim]:
        """mode -> its lossless claim, for the modes that make one."""
        return {name: Claim(m["lossless_vs"], dict(m.get("lossless_params") or {}))
                for name, m in self.specs.items() if m.get("lossless_vs")}

    def picks(self, picker: str, names: Sequence[str] | None = None) -> list[str]:
        """The modes `picker` chooses by default (the mode's `picked`), in its order of preference, among `names`
        (default: those the served model can run)."""
        offered = self.names() if names is None else list(names)
        chosen = [n for n in offered if picker in ((self.specs.get(n) or {}).get("picked") or {})]
        return sorted(chosen, key=lambda n: self.specs[n]["picked"][picker])

    def pick(self, picker: str, names: Sequence[str] | None = None) -> str | None:
        """The default of a one-mode picker: its first choice the served model can run, else the first mode it can."""
        offered = self.names() if names is None else list(names)
        return next(iter(self.picks(picker, offered)), offered[0] if offered else None)

    def rivals(self, names: Sequence[str] | None = None) -> list[str]:
        """The modes a picker that runs beside the baseline offers: every one but the baseline."""
        offered = self.names() if names is None else list(names)
        return [n for n in offered if n != self.baseline]

    def columns(self, modes: Iterable[str]) -> list[Mapping[str, str]]:
        """The metric columns the given modes declare (each once, in the order first declared)."""
        seen: dict[str, Mapping[str, str]] = {}
        for mode in dict.fromkeys(modes):
            for column in (self.specs.get(mode) or {}).get("columns") or []:
                seen.setdefault(column["key"], column)
        return list(seen.values())

    def all_columns(self) -> list[Mapping[str, str]]:
        return self.columns(self.specs)
