"""Retry policies and timeouts, one named constant per tool class.

Temporal owns retries. The Stripe SDK's own retries are off (see activities/payments.py),
so each attempt here is one request carrying the same intent key. Money and irreversible
activities may be retried only because they verify with the ledger and the provider first.
"""

from datetime import timedelta

from temporalio.common import RetryPolicy

from core.models import ToolClass

NON_RETRYABLE = ["InvalidToolInput", "Configuration"]


def _bounded(first: timedelta, longest: timedelta, attempts: int) -> RetryPolicy:
    return RetryPolicy(initial_interval=first, backoff_coefficient=2.0, maximum_interval=longest,
                       maximum_attempts=attempts, non_retryable_error_types=NON_RETRYABLE)


READ_POLICY = _bounded(timedelta(milliseconds=500), timedelta(seconds=10), 5)
IDEMPOTENT_WRITE_POLICY = READ_POLICY
# Ten attempts, close together: a paused worker's open activity polls (five by default) can each
# swallow a retry that then times out (seen: attempts 3-7 of one call), and an attempt may only wait
# out another's settle horizon (activities/effects.py) before the provider is asked again.
MONEY_POLICY = _bounded(timedelta(seconds=1), timedelta(seconds=4), 10)
IRREVERSIBLE_POLICY = _bounded(timedelta(seconds=1), timedelta(seconds=10), 3)
MODEL_POLICY = _bounded(timedelta(seconds=1), timedelta(seconds=30), 5)

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
