"""Starting tasks the way starter.py does, and reading what they did."""

from __future__ import annotations

import asyncio

from temporalio.client import Client, WorkflowHandle

from config import Settings
from core.models import Checkpoint, TaskInput, TaskResult
from core.scenarios import SCENARIOS
from starter import start_task
from tests.conftest import unique


def scenario_task(name: str, **model_options) -> TaskInput:
    task = SCENARIOS[name](**model_options)
    return task.model_copy(update={"task_id": unique(task.task_id)})


async def start(client: Client, settings: Settings, task: TaskInput) -> WorkflowHandle:
    return await start_task(client, settings, task)


async def run(client: Client, settings: Settings, task: TaskInput) -> TaskResult:
    return await (await start(client, settings, task)).result()


async def wait_for(predicate, what: str, timeout: float = 60.0, every: float = 0.2):
    """Poll an async predicate until it returns something truthy, or fail after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(every)


async def checkpoint(handle: WorkflowHandle) -> Checkpoint:
    return await handle.query("checkpoint", result_type=Checkpoint)


async def waiting(handle: WorkflowHandle, timeout: float = 60.0) -> Checkpoint:
    """The checkpoint once the task waits for a human."""
    async def check():
        cp = await checkpoint(handle)
        return cp if cp.state == "awaiting_human" else None
    return await wait_for(check, f"{handle.id} to wait for a human", timeout)
