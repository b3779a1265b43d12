"""Runs record the sweep that made them and their cell of its grid (run_start's `sweep`).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-07
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("sweep", sa.String(128), nullable=True))
        batch.add_column(sa.Column("cell", sa.JSON(), nullable=True))
        batch.create_index(op.f("ix_runs_sweep"), ["sweep"])


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_index(op.f("ix_runs_sweep"))
        batch.drop_column("cell")
        batch.drop_column("sweep")
