"""Starting tasks the way starter.py does, and reading what they did."""

from __future__ import annotations

from temporalio.client import Client, WorkflowHandle

from config import Settings
from core.models import TaskInput, TaskResult
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
