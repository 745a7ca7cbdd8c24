"""Names the worker, the starter and the workflow must agree on."""

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

DEFAULT_TASK_QUEUE = "agent-tasks"
WORKFLOW_NAME = "AgentTask"
MODEL_TURN_ACTIVITY = "model_turn"

STATUS_ATTR = SearchAttributeKey.for_keyword("AgentStatus")
SCENARIO_ATTR = SearchAttributeKey.for_keyword("AgentScenario")
ESCALATION_ATTR = SearchAttributeKey.for_keyword("AgentEscalation")

SEARCH_ATTRIBUTES = {
    "AgentStatus": "Keyword",
    "AgentScenario": "Keyword",
    "AgentEscalation": "Keyword",
}


def starting_attributes(scenario: str) -> TypedSearchAttributes:
    """What a task's search attributes are from its start, before its first workflow task."""
    return TypedSearchAttributes([SearchAttributePair(STATUS_ATTR, "running"),
                                  SearchAttributePair(SCENARIO_ATTR, scenario)])
