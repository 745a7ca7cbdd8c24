"""What Temporal says of each task once every worker is stopped: its end state, and when each of its
escalations asked a person (from the history: no worker is needed to read it, and none is running).

End states are the workflow's own words: a closed run's result (`state`, and the dead letter's
reason), or for a run still open the `AgentStatus` search attribute it keeps up to date. An open run
that is not waiting for a person, a run that failed or was terminated, and a task that never started
are *lost*.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import SearchAttributeKey
from temporalio.service import RPCError

log = logging.getLogger("judge")

STATUS = SearchAttributeKey.for_keyword("AgentStatus")
SETTLED = ("completed", "dead_lettered", "cancelled", "awaiting_human")
MAX_RUNS = 50  # a task's chain of runs (continue-as-new) walked back at most this far


@dataclass(frozen=True)
class EndState:
    state: str       # completed / dead_lettered / cancelled / awaiting_human, or why it is lost
    cause: str = ""  # a dead letter's or a cancellation's reason

    @property
    def lost(self) -> bool:
        return self.state not in SETTLED


async def end_states(client: Client, task_ids: list[str], parallel: int = 16) -> dict[str, EndState]:
    gate = asyncio.Semaphore(parallel)

    async def one(task_id: str) -> tuple[str, EndState]:
        async with gate:
            return task_id, await end_state(client, task_id)
    return dict(await asyncio.gather(*(one(t) for t in task_ids)))


async def end_state(client: Client, task_id: str) -> EndState:
    handle = client.get_workflow_handle(task_id)
    try:
        described = await handle.describe()
    except RPCError as err:
        return EndState("never started", str(err))
    if described.status == WorkflowExecutionStatus.COMPLETED:
        result: Any = await handle.result(follow_runs=False)
        checkpoint = result.get("checkpoint") or {}
        return EndState(result.get("state", "?"), checkpoint.get("dead_letter_reason") or "")
    if described.status == WorkflowExecutionStatus.RUNNING:
        status = described.typed_search_attributes.get(STATUS)
        return EndState("awaiting_human" if status == "awaiting_human" else f"still {status or 'running'}")
    return EndState(f"run {described.status.name.lower() if described.status else 'unknown'}")


async def alert_times(client: Client, task_id: str) -> dict[str, float]:
    """alert key -> when the person was asked (epoch seconds), for every escalation alert the task's runs
    scheduled. The alert is scheduled by the workflow task that starts the wait, so its event time is the
    moment of asking to the millisecond (the checkpoint's `since` has whole seconds only; the alert row
    is written when the activity runs, seconds later if a worker was killed meanwhile). An alert delivered
    by `ask_a_person`, which reads the world in the same attempt, is not here: its row's time (after the
    read, at delivery) is the moment of asking."""
    times: dict[str, float] = {}
    run_id: str | None = None
    for _ in range(MAX_RUNS):
        history = await client.get_workflow_handle(task_id, run_id=run_id).fetch_history()
        events = list(history.events)
        for event in events:
            if event.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                continue
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name != "raise_alert":
                continue
            try:
                alert = (await client.data_converter.decode(attrs.input.payloads))[0]
            except Exception as err:  # any codec's error: the alert row's time stands in for this one
                log.warning("alert input of %s not readable: %s", task_id, err)
                continue
            if not isinstance(alert, dict) or alert.get("kind") != "escalation":
                continue
            times.setdefault(alert["alert_key"], event.event_time.ToMicroseconds() / 1e6)
        started = events[0].workflow_execution_started_event_attributes if events else None
        run_id = started.continued_execution_run_id if started else None
        if not run_id:
            return times
    return times
