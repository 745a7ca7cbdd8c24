"""When a request of an intent may have left for the provider, and when the provider last answered one.

Owned by activities/ledger.py (`leaving`, `answered`, `claim`). `sent_at` is written, fenced, just
before the send-by check of each request; NULL while no request of the intent ever got that far: a
holder that never got that far is taken over as soon as its lease (its send-by time) has passed.
`answered_at` is written when the provider answered the request (a 5xx too). A request that left and
got no answer (a timeout, a dropped connection, a worker stopped mid-request) may be anywhere, and a
provider that ignores idempotency keys can land it later than it promised: past its horizon, with
the provider showing nothing, the ledger puts the intent to a person (`unknown`) instead of letting a
claim send it again.

Revision ID: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    with op.batch_alter_table("effects") as batch:
        batch.add_column(sa.Column("sent_at", sa.Float(precision=53), nullable=True))
        batch.add_column(sa.Column("answered_at", sa.Float(precision=53), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("effects") as batch:
        batch.drop_column("answered_at")
        batch.drop_column("sent_at")
