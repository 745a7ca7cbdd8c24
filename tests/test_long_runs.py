"""Long tasks continue as new within Temporal's limits, and an intent settled before the
continue-as-new still comes back already_performed after it."""

from __future__ import annotations

from temporalio.client import Client

from activities.world import World
from core.models import Outcome
from devstack.scenarios import long_run
from infra.settings import Settings
from tests.helpers import finished, running_worker, start, unique


async def test_long_task_continues_as_new_and_keeps_its_journal(client: Client, settings: Settings, world: World):
    task = long_run(turns=120, task_id=unique("long")).model_copy(update={"max_history_events": 400})
    async with running_worker(client, settings):
        handle = await start(client, settings, task)
        result = await finished(handle)
    assert result.state == "completed" and result.checkpoint.turns == 120
    assert result.checkpoint.runs >= 3, "the task continued as new"
    refund = result.checkpoint.steps["issue_refund"]
    assert refund.trail[0].startswith("ask 1: performed")
    assert refund.trail[1] == "ask 2: already_performed, from the task journal", "asked again after continue-as-new"
    assert refund.outcome is Outcome.ALREADY_PERFORMED
    assert [r["amount_cents"] for r in world.refunds("ORD-8841")] == [4500]
    assert result.checkpoint.compacted_steps > 0 and len(result.checkpoint.steps) < 60, "the view stays bounded"

    runs = [w async for w in client.list_workflows(f'WorkflowId = "{task.task_id}"')]
    assert len(runs) == result.checkpoint.runs
    for run in runs:
        history = await client.get_workflow_handle(task.task_id, run_id=run.run_id).fetch_history()
        assert len(history.events) <= 400 + 20
    assert handle.id == task.task_id
