"""initial schema: compiled shapes, artifacts, shape misses

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "compiled_shapes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("identity", sa.String(length=64), nullable=False),
        sa.Column("shape_hash", sa.String(length=64), nullable=False),
        sa.Column("model_name", sa.String(length=200), nullable=False),
        sa.Column("model_path", sa.Text(), nullable=False),
        sa.Column("model_revision", sa.String(length=200), nullable=True),
        sa.Column("config_hash", sa.String(length=64), nullable=False),
        sa.Column("toolchain_hash", sa.String(length=64), nullable=False),
        sa.Column("toolchain", sa.JSON(), nullable=False),
        sa.Column("workload", sa.String(length=16), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("seq_len", sa.Integer(), nullable=False),
        sa.Column("max_cache_len", sa.Integer(), nullable=True),
        sa.Column("dtype", sa.String(length=16), nullable=False),
        sa.Column("device", sa.String(length=16), nullable=False),
        sa.Column("backend", sa.String(length=32), nullable=False),
        sa.Column("mode", sa.String(length=32), nullable=False),
        sa.Column("tp_size", sa.Integer(), nullable=False),
        sa.Column("fsdp_size", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("claimed_by", sa.String(length=200), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("host", sa.String(length=200), nullable=True),
        sa.Column("compile_seconds", sa.Float(), nullable=True),
        sa.Column("graphs_compiled", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("compiled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("verified_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_compiled_shapes")),
        sa.UniqueConstraint("identity", name=op.f("uq_compiled_shapes_identity")),
    )
    with op.batch_alter_table("compiled_shapes", schema=None) as batch_op:
        batch_op.create_index("ix_compiled_shapes_family", ["model_name", "workload", "dtype"], unique=False)
        batch_op.create_index(batch_op.f("ix_compiled_shapes_shape_hash"), ["shape_hash"], unique=False)
        batch_op.create_index(batch_op.f("ix_compiled_shapes_status"), ["status"], unique=False)
        batch_op.create_index(batch_op.f("ix_compiled_shapes_toolchain_hash"), ["toolchain_hash"], unique=False)

    op.create_table(
        "shape_misses",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_name", sa.String(length=200), nullable=False),
        sa.Column("workload", sa.String(length=16), nullable=False),
        sa.Column("dtype", sa.String(length=16), nullable=False),
        sa.Column("tp_size", sa.Integer(), nullable=False),
        sa.Column("fsdp_size", sa.Integer(), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("seq_len", sa.Integer(), nullable=False),
        sa.Column("decision", sa.String(length=16), nullable=False),
        sa.Column("padded_batch", sa.Integer(), nullable=True),
        sa.Column("padded_seq", sa.Integer(), nullable=True),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(length=200), nullable=True),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_shape_misses")),
    )
    with op.batch_alter_table("shape_misses", schema=None) as batch_op:
        batch_op.create_index("ix_shape_misses_family", ["model_name", "workload"], unique=False)

    op.create_table(
        "artifacts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("shape_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["shape_id"], ["compiled_shapes.id"], name=op.f("fk_artifacts_shape_id_compiled_shapes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_artifacts")),
        sa.UniqueConstraint("shape_id", "kind", "path", name="uq_artifacts_shape_kind_path"),
    )
    with op.batch_alter_table("artifacts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_artifacts_shape_id"), ["shape_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("artifacts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_artifacts_shape_id"))

    op.drop_table("artifacts")
    with op.batch_alter_table("shape_misses", schema=None) as batch_op:
        batch_op.drop_index("ix_shape_misses_family")

    op.drop_table("shape_misses")
    with op.batch_alter_table("compiled_shapes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_compiled_shapes_toolchain_hash"))
        batch_op.drop_index(batch_op.f("ix_compiled_shapes_status"))
        batch_op.drop_index(batch_op.f("ix_compiled_shapes_shape_hash"))
        batch_op.drop_index("ix_compiled_shapes_family")

    op.drop_table("compiled_shapes")
