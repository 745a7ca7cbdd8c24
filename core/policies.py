"""Retry policies and timeouts, one named constant per tool class.

Temporal owns retries. The Stripe SDK's own retries are off (see activities/payments.py),
so each attempt here is one request carrying the same intent key. Money and irreversible
activities may be retried only because they verify with the ledger and the provider first.
"""

from datetime import timedelta

from temporalio.common import RetryPolicy

from core.models import ToolClass

NON_RETRYABLE = ["InvalidToolInput", "Configuration"]

READ_POLICY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500), backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10), maximum_attempts=5,
    non_retryable_error_types=NON_RETRYABLE,
)
IDEMPOTENT_WRITE_POLICY = READ_POLICY
MONEY_POLICY = RetryPolicy(
    initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10), maximum_attempts=3,
    non_retryable_error_types=NON_RETRYABLE,
)
IRREVERSIBLE_POLICY = MONEY_POLICY
MODEL_POLICY = RetryPolicy(
    initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30), maximum_attempts=5,
    non_retryable_error_types=NON_RETRYABLE,
)

# Storing a dead letter or a human's decision must eventually happen: retry without a cap
# (the pending activity stays visible in the Web UI) rather than fail the task.
OPS_POLICY = RetryPolicy(
    initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
    maximum_interval=timedelta(minutes=5), maximum_attempts=0,
)

POLICY_BY_CLASS = {
    ToolClass.READ: READ_POLICY,
    ToolClass.IDEMPOTENT_WRITE: IDEMPOTENT_WRITE_POLICY,
    ToolClass.MONEY: MONEY_POLICY,
    ToolClass.IRREVERSIBLE: IRREVERSIBLE_POLICY,
}

TOOL_START_TO_CLOSE = timedelta(seconds=60)
TOOL_HEARTBEAT = timedelta(seconds=2)
MODEL_START_TO_CLOSE = timedelta(seconds=120)

# Alerts, dead letters, human decisions on the ledger, the task's policy, a signature check.
OPS_START_TO_CLOSE = timedelta(seconds=30)
