"""requests: traffic_class (issue 29)

The traffic class a request belonged to when a scenario mixed classes (chat, agent, batch),
so per-class summaries and per-class SLOs can be judged again from the store. Nullable:
rows stored before this revision, and runs of one class, have none. Adding a nullable column
rewrites nothing already stored.

Revision ID: 0003
Revises: 0002
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("traffic_class", sa.String(length=40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_column("traffic_class")
