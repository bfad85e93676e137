"""compiled shapes record the attention implementation they were compiled with

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04

A model loaded with ``attn_implementation="eager"`` and the same model on ``sdpa``
trace different graphs, yet nothing in a row said which one it was compiled for:
a guard could prime an sdpa model on eager rows. The manifest now declares it, it
is part of each row's identity, and the row stores it so ``warmcache explain`` and
the guard can name it. Existing rows get NULL: compiled with whatever transformers
picked, as before. The rest of the fingerprint's parts were already stored (the
``toolchain`` JSON column holds each part, compiler variables included).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("compiled_shapes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("attn_implementation", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("compiled_shapes", schema=None) as batch_op:
        batch_op.drop_column("attn_implementation")
