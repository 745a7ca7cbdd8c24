"""Start, follow, decide and redrive tasks, through Temporal only."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from client.errors import ClientError
from client.facts import check_facts
from client.tickets import Ticket, TicketError
from core.models import Checkpoint, DecisionReceipt, ResolveInput, TaskInput, TaskResult
from core.names import FOLD_MARKER, WORKFLOW_NAME, starting_attributes
from infra import connection
from infra.settings import Settings

_TASK_TIMEOUT = timedelta(seconds=3)  # a workflow task lost with a dead worker is retried in 3 s


async def connect(settings: Settings) -> Client:
    try:
        return await connection.connect(settings)
    except ValueError as err:  # a malformed encryption key or connection profile
        raise ClientError(str(err)) from None
    except Exception as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ClientError(f"cannot reach Temporal at {connection.address(settings)} ({first}); "
                          f"is the stack up? `make up` starts the local one") from None


def describe_task(task: TaskInput, amount_cents: int | None = None) -> tuple[str, str]:
    """The task's one-line summary and its details, as the Web UI shows them at the top of its page."""
    order_id, invoice_id, item_id = (task.facts.get(k) for k in ("order_id", "invoice_id", "item_id"))
    amount = [f"${amount_cents / 100:,.2f}"] if amount_cents is not None else []
    parts = [task.scenario, task.task_id]
    parts += [f"order {order_id}"] if order_id else []
    parts += [f"item {item_id}"] if item_id else []
    parts += [f"invoice {invoice_id}"] if invoice_id else []
    details = "\n".join([f"**{task.scenario}** task `{task.task_id}`", "",
                         *(f"- {name}: `{value}`" for name, value in sorted(task.facts.items())),
                         *([f"- amount: {amount[0]}"] if amount else []),
                         "", "Current details (User Metadata) show what the task is doing and what it waits for."])
    return " · ".join(parts + amount), details


async def start_task(client: Client, settings: Settings, task: TaskInput,
                     amount_cents: int | None = None) -> WorkflowHandle[Any, TaskResult]:
    """Start the task, or attach to it when a run with this id is going or has completed.

    A completed task is never run again by a plain start (redrive is explicit); a failed or
    terminated one may be, and its intent keys make the done steps come back already_performed
    (`start_ticket` and `redrive` give the new run the keys the task began with; a caller of this one
    that starts a task again gives them itself, `keys_begun_with`).
    Approvers, ceilings and the escalation deadline are the worker's, not the starter's.
    """
    summary, details = describe_task(task, amount_cents)
    try:
        return await client.start_workflow(
            WORKFLOW_NAME, task, id=task.task_id, task_queue=settings.task_queue, result_type=TaskResult,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
            task_timeout=_TASK_TIMEOUT, static_summary=summary, static_details=details,
            search_attributes=starting_attributes(task.scenario),
        )
    except WorkflowAlreadyStartedError:
        return client.get_workflow_handle(task.task_id, result_type=TaskResult)


def started_now(handle: WorkflowHandle[Any, Any]) -> bool:
    """Whether the start that gave this handle started a run (False: it attached to one going or done)."""
    response = getattr(handle, "_start_workflow_response", None)  # the SDK keeps the server's answer there
    return bool(response is not None and response.started)


async def start_ticket(client: Client, settings: Settings, ticket: Ticket) -> WorkflowHandle[Any, TaskResult]:
    """Start the task for a ticket, or attach to the one already started for it.

    The task id is `ticket-<ticket_id>`: starting the same ticket again (a retried webhook, a second
    click) attaches to the running task or shows the finished one's result, and never starts a
    second task. The worker's configuration (model backend, ceilings, approvers) applies to it.

    A new task starts only once the worker has found its facts (the order or invoice) in our records
    and at the provider (client/facts.py); otherwise ClientError says why and nothing starts.
    """
    try:
        task = ticket.task_input()
    except TicketError as err:
        raise ClientError(str(err)) from None
    latest = await _latest_run(client, task.task_id)
    if latest is None or latest.status not in _GOING_OR_DONE:
        await check_facts(client, settings, task)
    if latest is not None and latest.status != WorkflowExecutionStatus.COMPLETED:
        # The start runs the task again if its run failed or was stopped, now or by the time it reaches the
        # server: the new run keeps the intent keys the task began with (attaching, it uses none of this).
        events = await _opening(client.get_workflow_handle(task.task_id, run_id=latest.run_id))
        [earlier] = await client.data_converter.decode(
            events[0].workflow_execution_started_event_attributes.input.payloads, [TaskInput])
        task = task.model_copy(update={"status_in_message_keys": keys_begun_with(earlier, events)})
    return await start_task(client, settings, task, ticket.amount_cents())


# A run of this id in one of these states is going or completed: a start attaches to it, and its facts were
# checked when it began.
_GOING_OR_DONE = (WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.COMPLETED,
                  WorkflowExecutionStatus.CONTINUED_AS_NEW)


async def _latest_run(client: Client, task_id: str) -> WorkflowExecutionDescription | None:
    """The latest run of this id, None when there is none."""
    try:
        return await client.get_workflow_handle(task_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise ClientError(f"cannot read task {task_id}: {err.message}") from None


@dataclass(frozen=True)
class ActivityWait:
    """A step Temporal runs again later on purpose: e.g. a request that may still land at the provider,
    waited out to its settle horizon before the provider is asked again (activities/effects.py `_wait`)."""

    task_id: str
    step: str  # the activity: the tool's name
    attempt: int  # the attempt that will run
    until: datetime  # when it runs
    why: str  # what the last attempt said


async def activity_waits(handle: WorkflowHandle[Any, Any]) -> list[ActivityWait]:
    """The task's activities waiting for a later attempt, with why (their last failure, decoded)."""
    raw = (await handle.describe()).raw_description
    waits = []
    for pending in raw.pending_activities:
        if not (pending.HasField("next_attempt_schedule_time") and pending.HasField("last_failure")):
            continue
        # The handle's client's converter: with PAYLOAD_ENCRYPTION_KEY the failure's message is encrypted too.
        failure = await handle._client.data_converter.decode_failure(pending.last_failure)
        waits.append(ActivityWait(task_id=handle.id, step=pending.activity_type.name, attempt=pending.attempt,
                                  until=pending.next_attempt_schedule_time.ToDatetime(UTC),
                                  why=getattr(failure, "message", str(failure))))
    return waits


async def follow(handle: WorkflowHandle[Any, TaskResult], on_checkpoint: Callable[[Checkpoint], None] | None = None,
                 until_waiting: bool = False,
                 on_wait: Callable[[list[ActivityWait]], None] | None = None) -> TaskResult | None:
    """The task's result, calling `on_checkpoint` with each checkpoint read on the way, and `on_wait`
    with the steps Temporal will run again later (a safety wait, a retry's backoff).

    With `until_waiting`, return None as soon as the task waits for a person.
    """
    result = asyncio.ensure_future(handle.result())
    try:
        while not result.done():
            if on_checkpoint is not None or until_waiting:
                try:
                    cp: Checkpoint | None = await handle.query("checkpoint", result_type=Checkpoint)
                except RPCError:
                    cp = None
                if cp is not None and on_checkpoint is not None:
                    on_checkpoint(cp)
                if cp is not None and until_waiting and cp.waiting_for is not None:
                    return None
            if on_wait is not None:
                try:
                    on_wait(await activity_waits(handle))
                except RPCError:
                    pass
            await asyncio.wait([result], timeout=0.5)
    finally:
        if not result.done():
            result.cancel()
    return result.result()


async def checkpoint_of(client: Client, task_id: str, rpc_timeout: timedelta | None = None) -> Checkpoint:
    try:
        cp: Checkpoint = await client.get_workflow_handle(task_id).query("checkpoint", result_type=Checkpoint,
                                                                         rpc_timeout=rpc_timeout)
    except RPCError as err:
        hint = "" if task_id.startswith(("ticket-", "invoice-")) else f" (a ticket's task is ticket-{task_id})"
        raise ClientError(f"no task {task_id}: {err.message}{hint}") from None
    except (WorkflowQueryFailedError, WorkflowQueryRejectedError) as err:  # e.g. no worker knows its code
        raise ClientError(f"{task_id} did not answer its checkpoint query: {str(err).splitlines()[0][:300]}") from None
    return cp


_DECIDE_TRIES = 3


async def decide(client: Client, decision: ResolveInput) -> DecisionReceipt:
    """Send a signed decision through the task's `decide` Update: the answer is what was applied."""
    handle = client.get_workflow_handle(decision.task_id)
    for _ in range(_DECIDE_TRIES):
        try:
            receipt: DecisionReceipt = await handle.execute_update("decide", decision, result_type=DecisionReceipt)
        except WorkflowUpdateFailedError as err:
            raise ClientError(f"decision not applied: {getattr(err.cause, 'message', err.cause)}") from None
        except RPCError as err:
            # The server aborts an Update still in flight when the task continues as new; nothing of
            # it was applied, and the same signed decision goes to the new run.
            if "aborted" in err.message:
                continue
            raise ClientError(f"no task {decision.task_id}: {err.message}") from None
        return receipt
    raise ClientError(f"decision not delivered: {decision.task_id} kept continuing as new; send it again")


async def _opening(handle: WorkflowHandle[Any, Any]) -> list[HistoryEvent]:
    """A run's events up to the markers its first completed workflow task recorded: its input and what
    `keys_begun_with` reads, without the rest of a long history."""
    events: list[HistoryEvent] = []
    cut = _Cut()
    async for event in handle.fetch_history_events(page_size=_OPENING_PAGE):
        if cut.past(event):
            break
        events.append(event)
    return events


def opening(events: Sequence[HistoryEvent]) -> list[HistoryEvent]:
    """The same cut of a history already read (`_opening`)."""
    cut = _Cut()
    return list(itertools.takewhile(lambda event: not cut.past(event), events))


class _Cut:
    """Where a run's opening ends: at the first event after the first completed workflow task's markers
    (the fold's among them). One pass: a run no worker took up may have a long history."""

    def __init__(self) -> None:
        self.completed = False

    def past(self, event: HistoryEvent) -> bool:
        if self.completed:
            return event.event_type != EventType.EVENT_TYPE_MARKER_RECORDED
        self.completed = event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
        return False


_OPENING_PAGE = 16  # a run's first workflow task completes within its first few events


def keys_begun_with(task: TaskInput, events: Sequence[HistoryEvent]) -> bool | None:
    """Whether the task of this run (its input, its history) has messages' money status in its intent keys,
    which a new run of it must keep: as its input says, else as its carry's checkpoint says (a continued run
    records the fold's marker whatever its task began with), else whether this first run recorded it.
    None: the run never completed a workflow task, so it decided nothing and the new run decides."""
    if task.status_in_message_keys is not None:
        return task.status_in_message_keys
    if task.carry is not None:
        return task.carry.checkpoint.status_in_message_keys
    return began_since_fold(events)


def began_since_fold(events: Sequence[HistoryEvent]) -> bool | None:
    """Whether a run began as a task does since the second fold (its history holds the fold's marker):
    then its messages' money status is part of their intent keys, and its redrive must keep that. None:
    it never completed a workflow task (no worker took it up), so it began nothing."""
    if not any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED for e in events):
        return None
    for event in events:
        marker = event.marker_recorded_event_attributes
        if event.event_type != EventType.EVENT_TYPE_MARKER_RECORDED or "patch-data" not in marker.details:
            continue
        for payload in marker.details["patch-data"].payloads:
            try:
                if json.loads(payload.data).get("id") == FOLD_MARKER:
                    return True
            except (ValueError, AttributeError):
                continue
    return False


async def redrive(client: Client, settings: Settings, task_id: str, force: bool = False,
                  escalation_timeout_seconds: int | None = None) -> tuple[WorkflowHandle[Any, TaskResult],
                                                                          TaskInput, str]:
    """Start a dead-lettered (or failed, cancelled) task again with its original input.

    Done effects come back already_performed from the ledger: the intent keys are the same. The new
    run marks the dead letter redriven. `escalation_timeout_seconds` replaces how long the new run
    waits for a person when it escalates.
    """
    handle = client.get_workflow_handle(task_id, result_type=TaskResult)
    try:
        description = await handle.describe()
        history = await handle.fetch_history()
    except RPCError as err:
        raise ClientError(f"no task {task_id}: {err.message}") from None
    if description.status == WorkflowExecutionStatus.RUNNING:
        raise ClientError(f"{task_id} is still running; resolve it instead")
    completed = description.status == WorkflowExecutionStatus.COMPLETED
    status = description.status.name.lower() if description.status is not None else "unknown"
    state = (await handle.result()).state if completed else status
    if state == "completed" and not force:
        raise ClientError(f"{task_id} completed; --force to run it again anyway")
    started = history.events[0].workflow_execution_started_event_attributes
    [task] = await client.data_converter.decode(started.input.payloads, [TaskInput])
    # The latest run may have continued as new: its input holds what it carried. A redrive starts from the
    # task's own input (its policy read again, its questions asked afresh), keeping only the keys it began with.
    update: dict[str, Any] = {"redrive_of": description.run_id, "carry": None,
                              "status_in_message_keys": keys_begun_with(task, history.events)}
    if escalation_timeout_seconds is not None:
        update["escalation_timeout_seconds"] = escalation_timeout_seconds
    task = task.model_copy(update=update)
    summary, details = describe_task(task)
    new = await client.start_workflow(
        WORKFLOW_NAME, task, id=task.task_id, task_queue=settings.task_queue, result_type=TaskResult,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE, task_timeout=_TASK_TIMEOUT,
        static_summary=f"{summary} · redrive", static_details=details,
        search_attributes=starting_attributes(task.scenario))
    return new, task, state
