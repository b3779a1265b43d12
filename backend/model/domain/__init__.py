"""The declared domain of the shipped model: task families with checkable, canonical answers."""
from __future__ import annotations

from backend.model.domain.code import JSON, PYFUNC
from backend.model.domain.family import Family, Instance
from backend.model.domain.lists import COPY, REVERSE, SORT
from backend.model.domain.numbers import ADD, COUNT, SPELL, TABLE

FAMILIES: dict[str, Family] = {f.name: f for f in (COUNT, TABLE, ADD, SORT, REVERSE, SPELL, JSON, PYFUNC, COPY)}

__all__ = ["FAMILIES", "Family", "Instance"]
