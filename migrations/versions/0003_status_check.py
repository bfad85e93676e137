"""compiled_shapes.status must be a stored status

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02

Statuses were free strings; a typo in code or a hand-edited row could store a
status no query recognises, and the shape would silently read as neither done nor
waiting. The database now refuses anything but the five stored statuses. SQLite
cannot add a constraint in place, so batch mode copies the table (rows kept).
The list is spelled out here, not imported: a revision describes the schema as it
was when written.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

STORED_STATUSES = ("pending", "compiling", "compiled", "verified", "failed")


def upgrade() -> None:
    with op.batch_alter_table("compiled_shapes", schema=None) as batch_op:
        batch_op.create_check_constraint(op.f("ck_compiled_shapes_status"), sa.column("status").in_(STORED_STATUSES))


def downgrade() -> None:
    with op.batch_alter_table("compiled_shapes", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_compiled_shapes_status"), type_="check")
