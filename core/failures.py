"""How a tool call ends without its effect, drawn in one place (activities/backends/_errors.py draws
the model's own failures the same way).

    ToolResult.reason: an answer the workflow records and the model reads
      Unusable              the gate cannot run the call (core/gate.py; out_of_scope: core/authority.py);
                            the model's reply counts as unusable and it may ask again
        unknown_tool, not_offered, malformed_arguments, invalid_arguments, out_of_scope
      Waiting               a person decides before anything moves
        approval_required   over the approval ceiling (activities/effects.py)
        unknown_outcome     the provider's records cannot tell whether it happened
        attempts_exhausted  asked too often without success
      Decided               a person has decided
        rejected_by_human
      (each tool's own refusals, e.g. unknown_order or false_money_claim, are a `not_performed` with a
      message for the model: nothing compares them)
    ApplicationError.type: an attempt that failed; Temporal retries it by its tool class's policy
      retryable             NotSent, OutcomeUnverified, BudgetInFlight (activities/effects.py),
                            AlertNotDelivered, Model* (activities/backends/_errors.py)
      final                 InvalidToolInput (core/policies.py NON_RETRYABLE)

A reason is a StrEnum member: its value is the string the histories record, so it compares equal to
a recorded reason and is serialized as that string. A failure's `type` is its class's name.
"""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum
from typing import ClassVar

from temporalio.exceptions import ApplicationError


class Unusable(StrEnum):
    """The gate cannot run the call; the model may ask again."""

    UNKNOWN_TOOL = "unknown_tool"
    NOT_OFFERED = "not_offered"
    MALFORMED_ARGUMENTS = "malformed_arguments"
    INVALID_ARGUMENTS = "invalid_arguments"
    OUT_OF_SCOPE = "out_of_scope"


class Waiting(StrEnum):
    """A person decides before the call moves on."""

    APPROVAL_REQUIRED = "approval_required"
    UNKNOWN_OUTCOME = "unknown_outcome"
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"


class Decided(StrEnum):
    """A person has decided the call."""

    REJECTED_BY_HUMAN = "rejected_by_human"


class Failure(ApplicationError):
    """An activity attempt that failed. Its `type` (what the history records and retry policies name)
    is its class's name; `final` ones are not retried."""

    final: ClassVar[bool] = False

    def __init__(self, message: str, *, next_retry_delay: timedelta | None = None) -> None:
        super().__init__(message, type=type(self).__name__, non_retryable=self.final,
                         next_retry_delay=next_retry_delay)


class InvalidToolInput(Failure):
    """A tool activity called without what the workflow always sends it (an intent key)."""

    final = True


class AlertNotDelivered(Failure):
    """The alert webhook did not take an alert; the activity tries again."""
