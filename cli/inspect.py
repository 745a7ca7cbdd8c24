"""`status` and `list`: what tasks are doing, read from Temporal."""

from __future__ import annotations

import argparse
import asyncio
import typing
from datetime import timedelta

from temporalio.client import WorkflowQueryFailedError

from cli.output import decide_hint
from client import ClientError, checkpoint_of, connect
from core.models import TaskState
from infra.settings import Settings

_LIST_QUERY_TIMEOUT = timedelta(seconds=5)  # a waiting task whose worker is down answers no query


async def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    client = await connect(settings)
    cp = await checkpoint_of(client, args.task_id)
    if args.details:
        print(cp.model_dump_json(indent=2))
        return 0
    print(f"{cp.task_id}: {cp.state}, {cp.turns} turns")
    for name, step in cp.steps.items():
        print(f"  {name:<22} {step.trail[-1] if step.trail else step.status}")
    if cp.waiting_for is not None:
        wait = cp.waiting_for
        print(f"  waits for a person: {wait.reason} on {wait.tool} ({wait.detail}); deadline {wait.deadline}\n"
              f"  decide: {decide_hint(cp.task_id, wait)}")
    return 0


async def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    """This deployment's tasks (its TASK_QUEUE) in a state, found through the AgentStatus search attribute.

    For waiting tasks it asks each one's checkpoint, all at once and briefly: a task whose worker is
    down is still listed, with a note instead of its details.
    """
    client = await connect(settings)
    query = f'AgentStatus="{args.status}" AND TaskQueue="{settings.task_queue}"'
    ids = [execution.id async for execution in client.list_workflows(query)]

    async def detail(task_id: str) -> str:
        if args.status != "awaiting_human":
            return ""
        try:
            cp = await checkpoint_of(client, task_id, _LIST_QUERY_TIMEOUT)
        except (ClientError, WorkflowQueryFailedError) as err:
            return f"(its checkpoint did not answer: {str(err).splitlines()[0] if str(err) else type(err).__name__})"
        wait = cp.waiting_for
        return f"{wait.reason} on {wait.tool}, key {wait.intent_key}" if wait else ""

    for task_id, text in zip(ids, await asyncio.gather(*(detail(i) for i in ids)), strict=True):
        print(f"{task_id:<32} {args.status:<15} {text}")
    if not ids:
        print(f"no task is {args.status.replace('_', ' ')}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    st = sub.add_parser("status", help="what a task did and what it waits for")
    st.add_argument("task_id")
    st.add_argument("--details", action="store_true", help="the whole checkpoint, as JSON")
    st.set_defaults(run=cmd_status)
    ls = sub.add_parser("list", help="this task queue's tasks by status (AgentStatus search attribute)")
    ls.add_argument("--status", default="awaiting_human", choices=typing.get_args(TaskState))
    ls.set_defaults(run=cmd_list)
