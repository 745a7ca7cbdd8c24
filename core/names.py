"""Names the worker, the starter and the workflow must agree on."""

from temporalio.common import SearchAttributeKey

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
