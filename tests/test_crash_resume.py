"""A worker process SIGKILLed at each step of refund-8841, including after the provider
accepted the refund and before anything recorded it; a fresh worker finishes the task
with exactly one refund and one customer email."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from activities.world import World
from devstack.attempts import cause_of
from devstack.stack import Stack
from infra.liveness import WORKER_LOST
from infra.settings import Settings
from tests.helpers import scenario_task, start, wait_for

CRASH_POINTS = [
    "model_turn:start",
    "get_order:end",
    "issue_refund:start",
    "issue_refund:before_provider",
    "issue_refund:after_provider",
    "issue_refund:end",
    "write_confirmation:start",
    "notify_customer:after_send",
    "notify_customer:end",
]

# Points inside an attempt the liveness keeper holds (infra/liveness.py): when the worker dies there,
# the keeper fails the attempt at once and its retry says why; elsewhere the server times it out.
HELD_BY_THE_KEEPER = {"issue_refund:before_provider", "issue_refund:after_provider", "notify_customer:after_send"}


@pytest.mark.parametrize("point", CRASH_POINTS)
async def test_worker_killed_at_each_step_resumes_without_a_second_effect(
    point: str, stack: Stack, client: Client, settings: Settings, world: World, worker_env: dict[str, str],
    tmp_path: Path,
):
    crashing = stack.start_worker(tmp_path / "crashing.log",
                                  {**worker_env, "CRASH_AT": point, "CRASH_MARKER": str(tmp_path / "crashed")})
    if point in HELD_BY_THE_KEEPER:  # a worker does not wait for its keeper; this test does, to see it act
        await wait_for(lambda: _logged(tmp_path / "crashing.log", "liveness keeper ready"), "the keeper", 60)
    task = scenario_task("refund-8841")
    handle = await start(client, settings, task)
    code = await asyncio.to_thread(crashing.process.wait, 60)
    assert code == -signal.SIGKILL, f"worker did not crash at {point}: exit {code}"
    assert (tmp_path / "crashed").read_text() == point
    if point in HELD_BY_THE_KEEPER:
        assert await wait_for(lambda: _retried_because(handle, point.split(":")[0]),
                              f"a retry of {point}") == WORKER_LOST

    fresh = stack.start_worker(tmp_path / "fresh.log", worker_env)
    try:
        result = await asyncio.wait_for(handle.result(), 90)
    finally:
        fresh.stop()

    assert result.state == "completed"
    refunds = world.refunds("ORD-8841")
    assert [r["amount_cents"] for r in refunds] == [4500]
    assert refunds[0]["intent_key"] == result.checkpoint.steps["issue_refund"].intent_key
    effects = {e["tool"]: e for e in world.effects(task.task_id)}
    assert effects["issue_refund"]["status"] == "performed"
    assert effects["issue_refund"]["provider_ref"] == refunds[0]["id"]
    assert [m["recipient"] for m in world.messages(task.task_id)] == ["tom.brennan@example.com"]
    assert world.records.confirmation(task.task_id, "ORD-8841") is not None
    if point in HELD_BY_THE_KEEPER:  # the keeper took the run off the dead worker's sticky queue
        events = (await handle.fetch_history()).events
        assert not [e for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT]


async def _retried_because(handle: WorkflowHandle, activity_type: str) -> str | None:
    """Why the server retries the pending activity (the last failure of its attempt before), once it has."""
    for pending in (await handle.describe()).raw_description.pending_activities:
        if pending.activity_type.name == activity_type and pending.attempt > 1:
            return cause_of(pending.last_failure)
    return None


async def _logged(log_file: Path, text: str) -> bool:
    return log_file.exists() and text in log_file.read_text()
