"""The liveness keeper (infra/liveness.py) against a real server, where the worker's death is awkwardly timed.
The keeper with a real worker: tests/test_crash_resume.py (a SIGKILL) and tests/test_admission.py (a held GIL)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from devstack.stack import Stack
from infra.liveness import PROJECT_ROOT, WORKER_LOST, vouch_line

HEARTBEAT = timedelta(seconds=120)  # longer than the test: only the keeper can end the first attempt in time
TOKENS: dict[str, asyncio.Future[bytes]] = {}


@activity.defn(name="held_by_a_dead_worker")
async def held_by_a_dead_worker() -> int:
    """Attempt 1 hands its task token to the test and runs on (its worker is the one that 'died'); a later
    attempt returns its number."""
    info = activity.info()
    if info.attempt == 1:
        TOKENS[info.workflow_id].set_result(info.task_token)
        await asyncio.Event().wait()
    return info.attempt


@workflow.defn(name="HeldByADeadWorker", sandboxed=False)
class HeldByADeadWorker:
    @workflow.run
    async def run(self) -> int:
        return await workflow.execute_activity(
            "held_by_a_dead_worker", result_type=int, heartbeat_timeout=HEARTBEAT,
            start_to_close_timeout=2 * HEARTBEAT,
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=100), maximum_attempts=2))


async def test_a_worker_dead_before_its_keeper_connected_still_has_its_attempts_failed(client: Client, stack: Stack):
    """A worker killed within a second of its start (a crash loop; a restart under load) dies while its keeper
    is still connecting to Temporal. The keeper has the worker's lines; once connected it must fail those
    attempts so their retries start now, though there is no one left to tell that it is ready (it stopped
    on that broken pipe, and each attempt waited out its heartbeat timeout)."""
    queue = f"keeper-{uuid.uuid4().hex[:8]}"
    TOKENS[queue] = asyncio.get_running_loop().create_future()
    async with Worker(client, task_queue=queue, workflows=[HeldByADeadWorker], activities=[held_by_a_dead_worker],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        handle = await client.start_workflow(HeldByADeadWorker.run, id=queue, task_queue=queue)
        token = await asyncio.wait_for(TOKENS[queue], 60)
        dead = subprocess.Popen(["true"])
        dead.wait()  # the keeper's worker: gone before the keeper starts
        unheard, ready = os.pipe()
        os.close(unheard)  # the dead worker's end of "ready": closed with it
        keeper = subprocess.Popen(
            [sys.executable, "-m", "infra.liveness", "--parent", str(dead.pid), "--address", stack.address,
             "--namespace", client.namespace, "--ready-fd", str(ready)],
            stdin=subprocess.PIPE, cwd=PROJECT_ROOT, pass_fds=(ready,))
        os.close(ready)
        assert keeper.stdin is not None
        keeper.stdin.write(vouch_line(token, HEARTBEAT.total_seconds(), None, queue,
                                      handle.result_run_id or "").encode())
        keeper.stdin.close()  # the worker's end of the keeper's pipe closes as it dies
        assert await asyncio.to_thread(keeper.wait, 60) == 0
        assert await asyncio.wait_for(handle.result(), 60) == 2
    started = [event.activity_task_started_event_attributes async for event in handle.fetch_history_events()
               if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED]
    assert [s.attempt for s in started] == [2]  # a history keeps the last attempt's start only
    assert started[0].last_failure.application_failure_info.type == WORKER_LOST
