"""The latest ask of each caller on each intent, so an attempt of an earlier ask claims nothing.

Owned by activities/ledger.py (`claim`, `advance`). `caller` is a task's workflow id; `generation` when
Temporal scheduled the step (a call's ask, a reading of the world, a person's word recorded) that last
touched the intent, and `attempt` that step's attempt number (0 for steps that claim nothing). A claim
from an older (generation, attempt) is refused as superseded: its workflow has moved on.

Revision ID: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"

Time = sa.Float(precision=53)


def upgrade() -> None:
    op.create_table(
        "effect_asks",
        sa.Column("intent_key", sa.Text, primary_key=True),
        sa.Column("caller", sa.Text, primary_key=True),
        sa.Column("generation", Time, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("updated_at", Time, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("effect_asks")
