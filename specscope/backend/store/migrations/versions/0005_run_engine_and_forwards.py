"""Runs record the engine that ran them (run_start's `engine`) and the span of its forwards they took part in, so a
stored run's forwards can be rebuilt with every stored run that shared them.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-07
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("engine", sa.String(32), nullable=True))
        batch.add_column(sa.Column("first_forward", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("last_forward", sa.Integer(), nullable=True))
        batch.create_index(op.f("ix_runs_engine"), ["engine"])


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_index(op.f("ix_runs_engine"))
        batch.drop_column("last_forward")
        batch.drop_column("first_forward")
        batch.drop_column("engine")
