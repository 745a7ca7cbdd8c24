"""Changing workflow code safely: an incompatible change is caught by replaying the corpus;
the same change behind `workflow.patched` replays old histories and runs new tasks the new way.
A worker with no workflow cache replays the whole history on every task and still completes."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.workflow import NondeterminismError

from activities.world import World
from infra.settings import Settings
from tests.evolution_workflows import PATCH, PatchedChange, UnguardedChange
from tests.helpers import run, scenario_task
from tests.test_replay import CORPUS, HISTORIES, load, replayer
from worker import Extensions, build_worker
from workflows import AgentTaskWorkflow

HAPPY = Path(__file__).parent / "histories" / "su-88421-happy.json"


async def test_an_unguarded_change_is_caught_by_replay():
    with pytest.raises(NondeterminismError):
        await replayer(UnguardedChange).replay_workflow(load(HAPPY))


@pytest.mark.parametrize("path", CORPUS, ids=[str(p.relative_to(HISTORIES).with_suffix("")) for p in CORPUS])
async def test_the_patched_change_replays_every_old_history(path: Path):
    await replayer(PatchedChange).replay_workflow(load(path))


async def test_the_patched_change_runs_new_tasks_the_new_way(client: Client, settings: Settings, world: World):
    task = scenario_task("SU-88421")
    async with build_worker(client, settings, extensions=Extensions(workflow=PatchedChange)):
        result = await run(client, settings, task)
    history = await client.get_workflow_handle(task.task_id).fetch_history()
    scheduled = [e.activity_task_scheduled_event_attributes.activity_type.name for e in history.events
                 if e.HasField("activity_task_scheduled_event_attributes")]
    assert scheduled[:2] == ["search_policy", "model_turn"]  # the task's policy is a local activity
    patches = [e for e in history.events if e.HasField("marker_recorded_event_attributes")
               and e.marker_recorded_event_attributes.marker_name == "core_patch"]
    assert sum(PATCH.encode() in e.SerializeToString() for e in patches) == 1
    assert result.state == "completed" and len(world.refunds("SU-88421")) == 1
    await replayer(PatchedChange).replay_workflow(history)
    with pytest.raises(NondeterminismError):
        await replayer(AgentTaskWorkflow).replay_workflow(history)


async def test_a_worker_without_cache_replays_every_task_and_completes(client: Client, settings: Settings,
                                                                       world: World):
    task = scenario_task("SU-88421", repeat_effects=1)
    async with build_worker(client, settings, max_cached_workflows=0):
        result = await run(client, settings, task)
    assert result.state == "completed" and len(world.refunds("SU-88421")) == 1
