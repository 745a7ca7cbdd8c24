"""Names the worker, the starter and the workflow must agree on."""

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

DEFAULT_TASK_QUEUE = "agent-tasks"
WORKFLOW_NAME = "AgentTask"
MODEL_TURN_ACTIVITY = "model_turn"
# The patch marker a run started since the second fold records (workflows/_agent.py `_FOLDED`); a redrive
# reads it to give the new run the intent keys its task began with (client/tasks.py).
FOLD_MARKER = "one-marker-2026-12-07"

STATUS_ATTR = SearchAttributeKey.for_keyword("AgentStatus")
SCENARIO_ATTR = SearchAttributeKey.for_keyword("AgentScenario")
ESCALATION_ATTR = SearchAttributeKey.for_keyword("AgentEscalation")
# Set while a task waits for a person (and kept if that wait makes it a dead letter), unset otherwise:
# columns for the Web UI's list of waiting tasks (and of dead letters).
WAIT_REASON_ATTR = SearchAttributeKey.for_keyword("AgentWaitReason")  # "approval_required: issue_refund"
AMOUNT_ATTR = SearchAttributeKey.for_int("AgentAmountCents")  # the waiting call's amount_cents, if it has one
DEADLINE_ATTR = SearchAttributeKey.for_datetime("AgentDeadline")  # when the wait becomes a dead letter

# Name -> type, as `temporal operator search-attribute create --type` and the dev server's
# `--search-attribute NAME=TYPE` spell it.
SEARCH_ATTRIBUTES = {
    "AgentStatus": "Keyword",
    "AgentScenario": "Keyword",
    "AgentEscalation": "Keyword",
    "AgentWaitReason": "Keyword",
    "AgentAmountCents": "Int",
    "AgentDeadline": "Datetime",
}


def starting_attributes(scenario: str) -> TypedSearchAttributes:
    """What a task's search attributes are from its start, before its first workflow task."""
    return TypedSearchAttributes([SearchAttributePair(STATUS_ATTR, "running"),
                                  SearchAttributePair(SCENARIO_ATTR, scenario)])
