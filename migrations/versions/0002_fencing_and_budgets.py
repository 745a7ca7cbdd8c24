"""The ledger as a fenced state machine, and budgets of business resources across tasks.

`fence` counts the claims of an intent (`owner` is the call, `attempt` its attempt number): every transition names the fence it holds, so a
write from an attempt that lost the intent changes nothing. `lease_until` is the time after
which the holder will not start a request; `horizon` the time after which no request of the
holder can still land at the provider. `holds` reserve an intent's amount against business
resources (an order item, an order, an invoice) whose limits live in `budgets`.

Revision ID: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"

Time = sa.Float(precision=53)


def upgrade() -> None:
    with op.batch_alter_table("effects") as batch:
        batch.add_column(sa.Column("fence", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("attempt", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("horizon", Time, nullable=False, server_default="0"))
    op.create_table(
        "budgets",
        sa.Column("resource", sa.Text, primary_key=True),
        sa.Column("limit_cents", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "holds",
        sa.Column("intent_key", sa.Text, sa.ForeignKey("effects.intent_key"), primary_key=True),
        sa.Column("resource", sa.Text, sa.ForeignKey("budgets.resource"), primary_key=True),
        sa.Column("amount_cents", sa.BigInteger, nullable=False),
    )
    op.create_index("holds_resource", "holds", ["resource"])


def downgrade() -> None:
    op.drop_index("holds_resource", "holds")
    op.drop_table("holds")
    op.drop_table("budgets")
    with op.batch_alter_table("effects") as batch:
        batch.drop_column("horizon")
        batch.drop_column("attempt")
        batch.drop_column("fence")
