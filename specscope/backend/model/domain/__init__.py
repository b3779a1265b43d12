"""The declared domain of the shipped model: task families with checkable, canonical answers."""
from __future__ import annotations

from specscope.backend.model.domain.code import JSON, PYFUNC
from specscope.backend.model.domain.family import Family, Instance
from specscope.backend.model.domain.lists import COPY, REVERSE, SORT
from specscope.backend.model.domain.numbers import ADD, COUNT, SPELL, TABLE

FAMILIES: dict[str, Family] = {f.name: f for f in (COUNT, TABLE, ADD, SORT, REVERSE, SPELL, JSON, PYFUNC, COPY)}

__all__ = ["FAMILIES", "Family", "Instance"]
