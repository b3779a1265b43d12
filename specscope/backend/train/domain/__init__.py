"""The declared domain of the shipped model: task families with checkable, canonical answers."""
from __future__ import annotations

from specscope.backend.train.domain.code import JSON, PYFUNC
from specscope.backend.train.domain.family import Instance, TaskFamily
from specscope.backend.train.domain.lists import COPY, REVERSE, SORT
from specscope.backend.train.domain.numbers import ADD, COUNT, SPELL, TABLE

TASK_FAMILIES: dict[str, TaskFamily] = {f.name: f for f in (COUNT, TABLE, ADD, SORT, REVERSE, SPELL, JSON, PYFUNC,
                                                             COPY)}

__all__ = ["TASK_FAMILIES", "TaskFamily", "Instance"]
