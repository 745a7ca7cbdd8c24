"""The nonces of signed decisions that verified, kept across runs, redrives and workers.

Owned by activities/authority.py (`verify_decision`). `first_seen_by` is the verification that spent
the nonce (workflow id/run id/activity id): only a retry of that same activity verifies the decision
again. A row is pruned an hour after its decision's `expires_at`, when the decision is refused as
expired anyway.

Revision ID: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"

Time = sa.Float(precision=53)


def upgrade() -> None:
    op.create_table(
        "decision_nonces",
        sa.Column("nonce", sa.Text, primary_key=True),
        sa.Column("task_id", sa.Text, nullable=False),
        sa.Column("intent_key", sa.Text, nullable=False),
        sa.Column("decided_by", sa.Text, nullable=False),
        sa.Column("first_seen_by", sa.Text, nullable=False),
        sa.Column("expires_at", Time, nullable=False),
        sa.Column("created_at", Time, nullable=False),
    )
    op.create_index("decision_nonces_expires", "decision_nonces", ["expires_at"])
    op.create_index("decision_nonces_task", "decision_nonces", ["task_id"])


def downgrade() -> None:
    op.drop_index("decision_nonces_task", "decision_nonces")
    op.drop_index("decision_nonces_expires", "decision_nonces")
    op.drop_table("decision_nonces")
