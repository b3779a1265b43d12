"""Server leases: each server instance renews a row; runs record the instance that made them.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("instance", sa.String(64), nullable=False),
        sa.Column("server", sa.String(256), nullable=True),
        sa.Column("renewed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("instance", name=op.f("pk_leases")),
    )
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("instance", sa.String(64), nullable=True))
        batch.create_index(op.f("ix_runs_instance"), ["instance"])


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_index(op.f("ix_runs_instance"))
        batch.drop_column("instance")
    op.drop_table("leases")
