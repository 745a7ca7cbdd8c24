"""Two versions of a change to the agent workflow, for tests/test_evolution.py.

Kept apart from the tests because the workflow sandbox re-imports a workflow's module, and
this one must import workflow code only.
"""

# Annotations evaluated, as in workflows/agent_task.py: the SDK compares the run method's with __init__'s.
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from core import policies
    from core.models import TaskInput, TaskResult, ToolInput, ToolResult
    from workflows import AgentTaskWorkflow

PATCH = "policy-check-before-first-turn"


async def _policy_check(task: TaskInput) -> None:
    await workflow.execute_activity(
        "search_policy", ToolInput(task_id=task.task_id, tool="search_policy", arguments={"query": "refund"}),
        result_type=ToolResult, start_to_close_timeout=policies.TOOL_START_TO_CLOSE,
        retry_policy=policies.READ_POLICY)


@workflow.defn(name="AgentTask")
class UnguardedChange(AgentTaskWorkflow):
    """Adds an activity before the existing first one, with no guard."""

    @workflow.run
    async def run(self, task: TaskInput) -> TaskResult:
        await _policy_check(task)
        return await super().run(task)


@workflow.defn(name="AgentTask")
class PatchedChange(AgentTaskWorkflow):
    """The same change behind workflow.patched: old runs take the old path on replay."""

    @workflow.run
    async def run(self, task: TaskInput) -> TaskResult:
        if workflow.patched(PATCH):
            await _policy_check(task)
        return await super().run(task)
