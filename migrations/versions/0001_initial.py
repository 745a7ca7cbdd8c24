"""The ledger, orders, invoices, outbox, confirmations, alerts, dead letters, reconciliations.

Revision ID: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None

Time = sa.Float(precision=53)


def upgrade() -> None:
    op.create_table(
        "effects",
        sa.Column("intent_key", sa.Text, primary_key=True),
        sa.Column("task_id", sa.Text, nullable=False),
        sa.Column("tool", sa.Text, nullable=False),
        sa.Column("arguments", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("owner", sa.Text, nullable=False),
        sa.Column("lease_until", Time, nullable=False, server_default="0"),
        sa.Column("provider_ref", sa.Text),
        sa.Column("amount_cents", sa.BigInteger),
        sa.Column("detail", sa.Text),
        sa.Column("created_at", Time, nullable=False),
        sa.Column("updated_at", Time, nullable=False),
        sa.CheckConstraint("status IN ('intent', 'performed', 'not_performed', 'unknown')", name="effect_status"),
    )
    op.create_index("effects_task", "effects", ["task_id"])
    op.create_table(
        "orders",
        sa.Column("order_id", sa.Text, primary_key=True),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("customer_ref", sa.Text),
        sa.Column("payment_intent_id", sa.Text),
    )
    op.create_table(
        "invoices",
        sa.Column("invoice_id", sa.Text, primary_key=True),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("customer_ref", sa.Text),
    )
    op.create_table(
        "outbox",
        sa.Column("intent_key", sa.Text, primary_key=True),
        sa.Column("task_id", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("recipient", sa.Text, nullable=False),
        sa.Column("subject", sa.Text),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("created_at", Time, nullable=False),
    )
    op.create_table(
        "confirmations",
        sa.Column("task_id", sa.Text, primary_key=True),
        sa.Column("order_id", sa.Text, primary_key=True),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("updated_at", Time, nullable=False),
    )
    op.create_table(
        "alerts",
        sa.Column("alert_key", sa.Text, primary_key=True),
        sa.Column("task_id", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("intent_key", sa.Text),
        sa.Column("summary", sa.Text, nullable=False),
        sa.Column("delivered", sa.Text, nullable=False),
        sa.Column("created_at", Time, nullable=False),
    )
    op.create_table(
        "dead_letters",
        sa.Column("task_id", sa.Text, primary_key=True),
        sa.Column("run_id", sa.Text, primary_key=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("checkpoint", sa.Text, nullable=False),
        sa.Column("created_at", Time, nullable=False),
        sa.Column("redriven_at", Time),
    )
    op.create_table(
        "reconciliations",
        sa.Column("id", sa.Integer, sa.Identity(), primary_key=True),
        sa.Column("created_at", Time, nullable=False),
        sa.Column("findings", sa.Integer, nullable=False),
        sa.Column("report", sa.Text, nullable=False),
    )


def downgrade() -> None:
    for table in ("reconciliations", "dead_letters", "alerts", "confirmations", "outbox", "invoices", "orders",
                  "effects"):
        op.drop_table(table)
