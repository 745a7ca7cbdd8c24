"""The outbox by task: a task's messages are counted against its caps before each send
(activities/records.py `send_once`), under the task's lock, so the count reads an index, not the table.

Revision ID: 0004
"""

from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    op.create_index("outbox_task", "outbox", ["task_id"])


def downgrade() -> None:
    op.drop_index("outbox_task", "outbox")
