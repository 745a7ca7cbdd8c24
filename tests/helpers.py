"""What tests share (fixtures stay in conftest.py): unique task ids, a worker in this process,
starting tasks the way starter.py does, and reading what they did."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import TypeVar

from temporalio.api.enums.v1 import PendingActivityState, PendingWorkflowTaskState
from temporalio.client import Client, WorkflowHandle

from activities.db import Database
from activities.operations import alerts
from client import start_task
from core.models import Checkpoint, TaskInput, TaskResult
from devstack.polling import poll_until
from devstack.scenarios import SCENARIOS
from infra.settings import Settings
from worker import Extensions, build_worker

_counter = itertools.count(1)
T = TypeVar("T")


def scenario_task(name: str, **model_options) -> TaskInput:
    task = SCENARIOS[name](**model_options)
    return task.model_copy(update={"task_id": unique(task.task_id)})


async def start(client: Client, settings: Settings, task: TaskInput) -> WorkflowHandle:
    return await start_task(client, settings, task)


async def run(client: Client, settings: Settings, task: TaskInput, timeout: float = 240.0) -> TaskResult:
    """The task's result; a task still open after `timeout` seconds fails the test with its state."""
    return await finished(await start(client, settings, task), timeout)


async def finished(handle: WorkflowHandle, timeout: float = 240.0) -> TaskResult:
    try:
        return await asyncio.wait_for(handle.result(), timeout)
    except TimeoutError:
        cp = await checkpoint(handle)
        raise AssertionError(f"{handle.id} still {cp.state} after {timeout:.0f} s, waiting for "
                             f"{cp.waiting_for}; {await pending(handle)}") from None


async def all_of(awaitables: Iterable[Awaitable[T]]) -> list[T]:
    """Each awaited together; the first that fails cancels the others and waits for them to end (a bare gather
    leaves them running into the next test)."""
    waits: list[asyncio.Future[T]] = []
    try:
        waits.extend(asyncio.ensure_future(a) for a in awaitables)
        return await asyncio.gather(*waits)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


async def pending(handle: WorkflowHandle) -> str:
    """What the server says a task waits on: its pending activities and workflow task, with attempts and
    the last failure (why a task that should have finished has not)."""
    raw = (await handle.describe()).raw_description
    parts = [f"{a.activity_type.name} attempt {a.attempt} {PendingActivityState.Name(a.state)}"
             + (f" last failure: {a.last_failure.message[:200]}" if a.HasField("last_failure") else "")
             for a in raw.pending_activities]
    if raw.HasField("pending_workflow_task"):
        task = raw.pending_workflow_task
        parts.append(f"workflow task attempt {task.attempt} {PendingWorkflowTaskState.Name(task.state)}")
    return "pending: " + ("; ".join(parts) or "nothing")


wait_for = poll_until


def alert_kinds(settings: Settings, task_id: str) -> list[str]:
    """The kinds of the alerts stored for a task, oldest first: who was asked, told or withdrawn from."""
    return [a["kind"] for a in alerts(Database(settings.agent_db_path), task_id)]


async def checkpoint(handle: WorkflowHandle) -> Checkpoint:
    return await handle.query("checkpoint", result_type=Checkpoint)


async def waiting(handle: WorkflowHandle, timeout: float = 150.0) -> Checkpoint:
    """The checkpoint once the task waits for a human (an unknown outcome takes up to ten money attempts)."""
    async def check():
        cp = await checkpoint(handle)
        return cp if cp.state == "awaiting_human" else None
    return await wait_for(check, f"{handle.id} to wait for a human", timeout)


@asynccontextmanager
async def running_worker(client: Client, settings: Settings, task_queue: str | None = None,
                         replace: Sequence[Callable] = ()) -> AsyncIterator[None]:
    async with build_worker(client, settings, task_queue, extensions=Extensions(replace=replace)):
        yield


def unique(task_id: str) -> str:
    """A task id no other test on this server uses."""
    return f"{task_id}-t{next(_counter)}-{uuid.uuid4().hex[:6]}"
