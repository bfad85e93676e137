"""compiled shapes remember the cache folder their artifacts live in

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02

``cache doctor`` forgot rows whose artifacts were missing from whatever folder it
was pointed at, when they had been compiled on the same host: a doctor run on the
wrong ``--cache-dir`` forgot a whole other cache's rows. Rows now name their folder.
Existing rows get NULL (unknown) and keep the old same-host rule.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("compiled_shapes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cache_root", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("compiled_shapes", schema=None) as batch_op:
        batch_op.drop_column("cache_root")
