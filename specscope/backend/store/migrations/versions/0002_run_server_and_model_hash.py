"""Runs record the server that made them (host:port) and the model's hash from run_start.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("server", sa.String(256), nullable=True))
        batch.add_column(sa.Column("model_hash", sa.String(128), nullable=True))
        batch.create_index(op.f("ix_runs_server"), ["server"])


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_index(op.f("ix_runs_server"))
        batch.drop_column("model_hash")
        batch.drop_column("server")
