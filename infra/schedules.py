"""The reconciliation schedule: created by the worker at start, idempotently."""

from __future__ import annotations

from datetime import timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
)

from core.models import ReconcileInput
from workflows import RECONCILE_WORKFLOW

RECONCILE_SCHEDULE_ID = "reconcile-ledger"


async def ensure_reconcile_schedule(client: Client, task_queue: str, every: timedelta,
                                    stale_after_seconds: int = 900, schedule_id: str = RECONCILE_SCHEDULE_ID) -> bool:
    """Create the schedule unless it exists; True when it was created now."""
    schedule = Schedule(
        action=ScheduleActionStartWorkflow(RECONCILE_WORKFLOW, ReconcileInput(stale_after_seconds=stale_after_seconds),
                                           id=f"{schedule_id}-run", task_queue=task_queue),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=every)]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )
    try:
        await client.create_schedule(schedule_id, schedule)
        return True
    except ScheduleAlreadyRunningError:
        return False
