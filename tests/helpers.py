"""Starting tasks the way starter.py does, and reading what they did."""

from __future__ import annotations

from temporalio.client import Client, WorkflowHandle

from infra.settings import Settings
from devstack.polling import poll_until
from core.models import Checkpoint, TaskInput, TaskResult
from devstack.scenarios import SCENARIOS
from starter import start_task
from tests.conftest import unique


def scenario_task(name: str, **model_options) -> TaskInput:
    task = SCENARIOS[name](**model_options)
    return task.model_copy(update={"task_id": unique(task.task_id)})


async def start(client: Client, settings: Settings, task: TaskInput) -> WorkflowHandle:
    return await start_task(client, settings, task)


async def run(client: Client, settings: Settings, task: TaskInput) -> TaskResult:
    return await (await start(client, settings, task)).result()


wait_for = poll_until


async def checkpoint(handle: WorkflowHandle) -> Checkpoint:
    return await handle.query("checkpoint", result_type=Checkpoint)


async def waiting(handle: WorkflowHandle, timeout: float = 60.0) -> Checkpoint:
    """The checkpoint once the task waits for a human."""
    async def check():
        cp = await checkpoint(handle)
        return cp if cp.state == "awaiting_human" else None
    return await wait_for(check, f"{handle.id} to wait for a human", timeout)
