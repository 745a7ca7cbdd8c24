"""The liveness keeper (infra/liveness.py) against a real server, where the worker's death is awkwardly timed.
The keeper with a real worker: tests/test_crash_resume.py (a SIGKILL) and tests/test_admission.py (a held GIL)."""

from __future__ import annotations

import asyncio
import os
import socket
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
from infra.liveness import CONNECT_AFTER_END, PROJECT_ROOT, WORKER_LOST, vouch_line

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


def _keeper(parent: int, address: str, namespace: str, lines: str) -> subprocess.Popen[bytes]:
    """`python -m infra.liveness` for a worker that is gone: its lines are in the keeper's stdin, whose end of
    the pipe is closed, and no one listens for "ready" (both ends closed with the dead worker)."""
    unheard, ready = os.pipe()
    os.close(unheard)
    told, written = os.pipe()
    with os.fdopen(written, "w") as worker_end:
        worker_end.write(lines)
    return _spawn(parent, address, namespace, told, ready)


def _spawn(parent: int, address: str, namespace: str, stdin: int, ready: int) -> subprocess.Popen[bytes]:
    """The keeper on `stdin` (a pipe's read end) saying "ready" on `ready`; both fds are closed here."""
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "infra.liveness", "--parent", str(parent), "--address", address,
             "--namespace", namespace, "--ready-fd", str(ready)],
            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=PROJECT_ROOT, pass_fds=(ready,))
    finally:
        os.close(ready)
        os.close(stdin)


def _gone() -> int:
    dead = subprocess.Popen(["true"])
    dead.wait()
    return dead.pid


async def _ended(keeper: subprocess.Popen[bytes]) -> tuple[int, str]:
    try:
        output, _ = await asyncio.to_thread(keeper.communicate, timeout=60)
    finally:
        if keeper.poll() is None:
            keeper.kill()
            keeper.wait()
    return keeper.returncode, output.decode(errors="replace")


async def test_a_worker_dead_before_its_keeper_connected_still_has_its_attempts_failed(client: Client, stack: Stack):
    """A worker killed within a second of its start (a crash loop; a restart under load) dies while its keeper
    is still connecting to Temporal. The keeper has the worker's lines; once connected it must fail those
    attempts so their retries start now, though there is no one left to tell that it is ready (it stopped
    on that broken pipe, and each attempt waited out its heartbeat timeout)."""
    queue = f"keeper-{uuid.uuid4().hex[:8]}"
    TOKENS[queue] = asyncio.get_running_loop().create_future()
    try:
        async with Worker(client, task_queue=queue, workflows=[HeldByADeadWorker],
                          activities=[held_by_a_dead_worker], workflow_runner=UnsandboxedWorkflowRunner()):
            handle = await client.start_workflow(HeldByADeadWorker.run, id=queue, task_queue=queue)
            token = await asyncio.wait_for(TOKENS[queue], 60)
            line = vouch_line(token, HEARTBEAT.total_seconds(), None, queue, handle.result_run_id or "")
            code, output = await _ended(_keeper(_gone(), stack.address, client.namespace, line))
            assert code == 0, output
            assert await asyncio.wait_for(handle.result(), 60) == 2
    finally:
        del TOKENS[queue]
    started = [event.activity_task_started_event_attributes async for event in handle.fetch_history_events()
               if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED]
    assert [s.attempt for s in started] == [2]  # a history keeps the last attempt's start only
    assert started[0].last_failure.application_failure_info.type == WORKER_LOST


async def test_the_last_lines_of_a_worker_found_gone_are_still_taken(client: Client, stack: Stack):
    """The keeper's beat loop can see the worker gone before its reader has taken the worker's last lines (a
    worker that vouched for an attempt and died at once). Here the worker is gone before the keeper is
    ready, and its line arrives just after: the keeper must read its pipe to the end before it fails what it
    holds (it cancelled the reader, and the attempt waited out its heartbeat timeout)."""
    queue = f"keeper-{uuid.uuid4().hex[:8]}"
    TOKENS[queue] = asyncio.get_running_loop().create_future()
    told, written = os.pipe()
    heard, ready = os.pipe()
    try:
        async with Worker(client, task_queue=queue, workflows=[HeldByADeadWorker],
                          activities=[held_by_a_dead_worker], workflow_runner=UnsandboxedWorkflowRunner()):
            handle = await client.start_workflow(HeldByADeadWorker.run, id=queue, task_queue=queue)
            token = await asyncio.wait_for(TOKENS[queue], 60)
            keeper = _spawn(_gone(), stack.address, client.namespace, told, ready)
            with os.fdopen(heard, "rb") as readiness, os.fdopen(written, "w") as worker_end:
                said = await asyncio.to_thread(readiness.read, 1)
                if said:
                    worker_end.write(vouch_line(token, HEARTBEAT.total_seconds(), None, queue,
                                                handle.result_run_id or ""))
            code, output = await _ended(keeper)
            assert said == b"1" and code == 0, output
            assert await asyncio.wait_for(handle.result(), 60) == 2
    finally:
        del TOKENS[queue]
    started = [event.activity_task_started_event_attributes async for event in handle.fetch_history_events()
               if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED]
    assert started[0].last_failure.application_failure_info.type == WORKER_LOST


async def test_a_keeper_that_cannot_reach_temporal_after_its_worker_ended_says_so_and_fails():
    """The same keeper, but Temporal accepts its connection and never answers: it gives up after
    CONNECT_AFTER_END seconds, says in the worker's log what it leaves to the heartbeat timeouts, and exits
    non-zero (it returned 0 without a word)."""
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen()  # connections complete in the backlog and are never read
        line = vouch_line(b"token", HEARTBEAT.total_seconds(), None, "wf", "run")
        code, output = await _ended(_keeper(_gone(), f"127.0.0.1:{mute.getsockname()[1]}", "default", line))
    assert code == 1, output
    assert f"did not answer within {CONNECT_AFTER_END:.0f} s: 1 attempt(s) left to their heartbeat timeouts" in output
