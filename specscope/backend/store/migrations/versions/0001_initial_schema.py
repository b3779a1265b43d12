"""Initial schema: runs, events, derived rounds and kv_intervals, comparisons.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def run_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], name=op.f(f"fk_{table}_run_id_runs"),
                                   ondelete="CASCADE")


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("mode", sa.String(64), nullable=False),
        sa.Column("model", sa.String(256), nullable=True),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("output", sa.Text(), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=True),
        sa.Column("n_rounds", sa.Integer(), nullable=False),
        sa.Column("n_tokens", sa.Integer(), nullable=False),
        sa.CheckConstraint("status IN ('running', 'done', 'cancelled', 'error', 'interrupted')",
                           name=op.f("ck_runs_status")),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_runs")),
    )
    for column in ("created_at", "mode", "status"):
        op.create_index(op.f(f"ix_runs_{column}"), "runs", [column])

    op.create_table(
        "events",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("t_ms", sa.Float(), nullable=False),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("round", sa.Integer(), nullable=True),
        sa.Column("payload", sa.JSON(), nullable=False),
        run_fk("events"),
        sa.PrimaryKeyConstraint("run_id", "seq", name=op.f("pk_events")),
    )
    op.create_index("ix_events_run_id_type", "events", ["run_id", "type"])
    op.create_index("ix_events_run_id_round", "events", ["run_id", "round"])

    op.create_table(
        "rounds",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("round", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("block_start", sa.Integer(), nullable=False),
        sa.Column("accepted_len", sa.Integer(), nullable=False),
        sa.Column("nfe", sa.Integer(), nullable=False),
        sa.Column("case", sa.String(8), nullable=True),
        sa.Column("payload", sa.JSON(), nullable=False),
        run_fk("rounds"),
        sa.PrimaryKeyConstraint("run_id", "round", name=op.f("pk_rounds")),
    )

    op.create_table(
        "kv_intervals",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("slot", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("alloc_seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("position", sa.Integer(), nullable=True),
        sa.Column("alloc_round", sa.Integer(), nullable=False),
        sa.Column("free_seq", sa.Integer(), nullable=True),
        sa.Column("free_round", sa.Integer(), nullable=True),
        sa.Column("end_reason", sa.String(32), nullable=True),
        run_fk("kv_intervals"),
        sa.PrimaryKeyConstraint("run_id", "slot", "alloc_seq", name=op.f("pk_kv_intervals")),
    )

    op.create_table(
        "comparisons",
        sa.Column("comparison_id", sa.String(64), nullable=False),
        sa.Column("label", sa.String(256), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("comparison_id", name=op.f("pk_comparisons")),
    )
    op.create_index(op.f("ix_comparisons_created_at"), "comparisons", ["created_at"])

    op.create_table(
        "comparison_runs",
        sa.Column("comparison_id", sa.String(64), nullable=False),
        sa.Column("position", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.ForeignKeyConstraint(["comparison_id"], ["comparisons.comparison_id"],
                                name=op.f("fk_comparison_runs_comparison_id_comparisons"), ondelete="CASCADE"),
        run_fk("comparison_runs"),
        sa.PrimaryKeyConstraint("comparison_id", "position", name=op.f("pk_comparison_runs")),
    )
    op.create_index(op.f("ix_comparison_runs_run_id"), "comparison_runs", ["run_id"])


def downgrade() -> None:
    for table in ("comparison_runs", "comparisons", "kv_intervals", "rounds", "events", "runs"):
        op.drop_table(table)
