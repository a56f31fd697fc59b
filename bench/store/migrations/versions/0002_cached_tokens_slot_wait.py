"""requests: cached_prompt_tokens and slot_wait_ns (issue 15)

cached_prompt_tokens: prompt tokens the server said it answered from its prefix cache
(usage.prompt_tokens_details.cached_tokens), so a run on cached prompts can be told apart.
slot_wait_ns: time a request waited for a --max-concurrency slot, which is the cap working
and not the client's send lag. Both nullable: rows stored before this revision say nothing.

Revision ID: 0002
Revises: 0001
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cached_prompt_tokens", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("slot_wait_ns", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_column("slot_wait_ns")
        batch_op.drop_column("cached_prompt_tokens")
