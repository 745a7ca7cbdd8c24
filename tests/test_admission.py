"""Honest under load (issue 26): a worker takes only the work it can run, and a live attempt is never
timed out by the server, however busy the worker's event loop.

Judged on the histories (devstack/attempts.py, as `make load` judges): no attempt timed out, every
activity done in its first attempt. No sleeps to wait and no timing assertions: a blocked event loop is
made by a CPU-bound step that holds it for several heartbeat timeouts.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import threading
import time
import uuid
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.db import Database
from activities.heartbeats import Beat, HeartbeatPump
from activities.interceptors import WorkerInterceptor, _beats
from activities.payments import StripeGateway
from activities.world import World
from devstack import attempts
from devstack.scenarios import batch_ticket
from devstack.seed import seed_scenarios
from devstack.stack import STRIPE_API_KEY
from infra.liveness import keeper_for
from infra.settings import Settings, cores, load_settings
from infra.telemetry import JsonFormatter, watch_gc_pauses
from tests.helpers import start, unique
from worker import build_worker, worker_options

HEARTBEAT = timedelta(seconds=1)
HOLD_SECONDS = 4 * HEARTBEAT.total_seconds()  # the server times out a silent attempt within 2 s


@activity.defn(name="hold_the_loop")
async def hold_the_loop(seconds: float) -> int:
    """CPU-bound on the event loop: nothing else of this worker's loop runs until it returns (no await)."""
    deadline, spins = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        spins += sum(range(200)) > 0
    return spins


@activity.defn(name="hold_the_loop")
async def beat_then_hold_the_loop(seconds: float) -> int:
    """The same step on a worker without the pump: it heartbeats the SDK's way (through the event loop)
    before holding it, as the interceptor's asyncio task did."""
    activity.heartbeat()
    return await hold_the_loop(seconds)


@activity.defn(name="hold_the_loop")
async def hold_the_gil(seconds: float) -> int:
    """Holds the GIL, as a full garbage collection of a big heap does: no thread of the process runs, the
    pump's neither (libc's sleep called without releasing the GIL)."""
    ctypes.PyDLL(None).sleep(int(seconds))
    return 0


@workflow.defn(name="HoldTheLoop", sandboxed=False)
class HoldTheLoop:
    @workflow.run
    async def run(self, seconds: float) -> str:
        try:
            await workflow.execute_activity(
                "hold_the_loop", seconds, result_type=int, heartbeat_timeout=HEARTBEAT,
                start_to_close_timeout=timedelta(seconds=60), retry_policy=RetryPolicy(maximum_attempts=1))
        except ActivityError as err:
            return f"failed: {err.cause}"
        return "completed"


async def _hold(client: Client, worker_interceptors: list, step) -> tuple[str, attempts.Attempts]:
    queue = f"hold-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[HoldTheLoop], activities=[step],
                      interceptors=worker_interceptors, workflow_runner=UnsandboxedWorkflowRunner()):
        handle = await client.start_workflow(HoldTheLoop.run, HOLD_SECONDS, id=queue, task_queue=queue)
        outcome = await handle.result()
        tally = await attempts.read(client, [handle.id])
    return outcome, tally


async def test_the_pump_keeps_an_attempt_alive_while_its_event_loop_is_blocked(client: Client):
    outcome, tally = await _hold(client, [WorkerInterceptor()], hold_the_loop)
    assert outcome == "completed"
    assert tally.activities == 1 and not tally.retries, tally.as_dict()  # attempt 1 closed it
    assert not tally.timeouts, tally.as_dict()


async def test_without_the_pump_the_same_blocked_loop_times_the_attempt_out(client: Client):
    """The control: the hold is long enough to time out an attempt whose beats wait for the loop."""
    outcome, tally = await _hold(client, [], beat_then_hold_the_loop)
    assert outcome.startswith("failed"), outcome
    assert tally.timeouts == {"heartbeat timeout": 1}, tally.as_dict()


async def test_the_keeper_keeps_an_attempt_alive_while_the_worker_holds_the_gil(client: Client):
    """A pause of the whole process (a long garbage collection) stops the pump too; the keeper, a process
    of its own, beats for the attempt meanwhile."""
    keeper = keeper_for(client)
    assert await asyncio.to_thread(keeper.wait_ready, 60), "the liveness keeper did not connect"
    outcome, tally = await _hold(client, [WorkerInterceptor(keeper)], hold_the_gil)
    assert outcome == "completed"
    assert tally.activities == 1 and not tally.retries, tally.as_dict()
    assert not tally.timeouts, tally.as_dict()


async def test_without_the_keeper_the_same_held_gil_times_the_attempt_out(client: Client):
    """The control: the pump alone cannot beat while the GIL is held."""
    outcome, tally = await _hold(client, [WorkerInterceptor()], hold_the_gil)
    assert outcome.startswith("failed"), outcome
    assert tally.timeouts == {"heartbeat timeout": 1}, tally.as_dict()


TICKETS, SLOTS = 50, 4


async def test_a_backlog_beyond_the_slots_waits_in_the_queue_and_no_live_attempt_times_out(
    client: Client, settings: Settings, world: World,
):
    """50 tickets at once on a worker allowed 4 activity slots (tool calls and model turns declare a 1 s
    heartbeat timeout): the backlog waits in the task queue, not in the worker, so every attempt starts
    when it is taken and none is timed out."""
    seed_scenarios(Database(settings.database), StripeGateway(STRIPE_API_KEY, settings.stripe_api_base, 10.0),
                   batch=TICKETS)
    small = settings.model_copy(update={"worker_activity_slots": SLOTS})
    tasks = [batch_ticket(n).model_copy(update={"task_id": unique(f"ticket-B-{n:05d}")})
             for n in range(1, TICKETS + 1)]
    async with build_worker(client, small):
        handles = [await start(client, settings, task) for task in tasks]
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 600)
    assert {r.state for r in results} == {"completed"}
    tally = await attempts.read(client, [h.id for h in handles])
    assert tally.activities >= TICKETS * 3, tally.as_dict()
    assert not tally.timeouts and "start-to-close timeout" not in tally.workflow_task_timeouts, tally.as_dict()
    assert not tally.workflow_task_failures, tally.as_dict()
    assert not tally.retries, tally.as_dict()  # every activity closed by its first attempt
    assert not tally.escalations, tally.as_dict()
    assert await _most_started_at_once(client, [h.id for h in handles]) <= SLOTS  # 4 when measured


async def _most_started_at_once(client: Client, workflow_ids: list[str]) -> int:
    """The most activity attempts the server had handed to the worker and not yet seen closed, from the
    events' times (a start and a close at the same instant: the close first)."""
    edges: list[tuple[float, int]] = []
    for workflow_id in workflow_ids:
        events = (await client.get_workflow_handle(workflow_id).fetch_history()).events
        for event in events:
            at = event.event_time.ToNanoseconds()
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                edges.append((at, +1))
            elif event.event_type in (EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
                                      EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
                                      EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT):
                edges.append((at, -1))
    most = running = 0
    for _, step in sorted(edges):
        running += step
        most = max(most, running)
    return most


def test_the_slots_come_from_the_settings_unless_the_caller_sizes_them(monkeypatch):
    """WORKER_* variables size the tuner every worker of ours gets; a caller's own sizing replaces it."""
    monkeypatch.setenv("WORKER_ACTIVITY_SLOTS", "4")
    monkeypatch.setenv("WORKER_TUNER", "resource")
    configured = load_settings()
    assert configured.slots == (2 * cores(), 4, 8 * cores())
    tuner = worker_options(configured)["tuner"]
    assert tuner._get_activities_max() == 4
    tuner._to_bridge_tuner()  # the SDK accepts it as it would at a worker's start
    assert "tuner" not in worker_options(configured, max_concurrent_activities=100)


class _Running:
    """How many of the Busy workflow's activations ran at once, at most (test bookkeeping, outside
    workflow logic). Counted, not read from thread names: the SDK's pool may start a thread more than
    the slots (a job arriving as a thread goes idle, a cache eviction), and only what runs at once
    contends for the GIL."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = self.most = 0

    def enter(self) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def leave(self) -> None:
        with self._lock:
            self.now -= 1


ACTIVATIONS = _Running()


@workflow.defn(name="Busy", sandboxed=False)
class Busy:
    @workflow.run
    async def run(self, seconds: float) -> int:
        ACTIVATIONS.enter()
        try:
            return await hold_the_loop(seconds)  # pure Python in the activation, as a heavy workflow task is
        finally:
            ACTIVATIONS.leave()


async def test_no_workflow_activation_waits_for_a_thread(client: Client, settings: Settings):
    """Twenty activations of 0.4 s at once, more than the workflow slots: the worker takes only as many as
    it has slots (2 per core), each on a thread of its own, so none fails the SDK's 2 s deadlock timer,
    which runs from the moment an activation is handed to the threads (a pool of 2 threads under 16 slots
    failed them), and no more threads contend for the GIL than there are slots."""
    ACTIVATIONS.most = 0
    queue = f"busy-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[Busy], **worker_options(settings)):
        handles = [await client.start_workflow(Busy.run, 0.4, id=f"{queue}-{n}", task_queue=queue)
                   for n in range(20)]
        await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 120)
    tally = await attempts.read(client, [h.id for h in handles])
    assert not tally.workflow_task_failures, tally.as_dict()
    assert 0 < ACTIVATIONS.most <= settings.slots[0] == 2 * cores(), ACTIVATIONS.most


def test_the_workflow_cache_comes_from_the_settings(monkeypatch):
    """WORKER_CACHED_WORKFLOWS reaches every worker of ours; unset, it holds more runs than the SDK's 1,000
    (a week's 4,200 tickets in flight at once replayed their runs from history on every task)."""
    assert worker_options(load_settings())["max_cached_workflows"] >= 4200
    monkeypatch.setenv("WORKER_CACHED_WORKFLOWS", "7")
    assert worker_options(load_settings())["max_cached_workflows"] == 7


def test_a_worker_process_log_counts_the_attempts_it_saw_timed_out(tmp_path):
    """`make week` runs its workers as processes of their own and counts, from their JSON log lines, the
    attempts each saw timed out while it ran them: the interceptor's line and the core's refused completion."""
    log_file = tmp_path / "worker.log"
    handler = logging.FileHandler(log_file)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("test.worker-log")
    logger.addHandler(handler)
    logging.getLogger("worker.gc").addHandler(handler)
    watch = watch_gc_pauses(0.0)  # every collection is said
    try:
        gc.collect()
        logger.warning("attempt timed out while running: %s %s attempt %d (reached the worker %.2f s after the"
                       " server started it, ran %.2f s)", "week-1", "issue_refund", 1, 1.2, 0.1)
        logger.warning("Activity not found on completion. This may happen if the activity has already been"
                       " cancelled but completed anyway.")
        logger.warning("tool issue_refund performed")
    finally:
        gc.callbacks.remove(watch)
        logger.removeHandler(handler)
        logging.getLogger("worker.gc").removeHandler(handler)
        handler.close()
    with log_file.open("a") as f:
        f.write("Traceback (most recent call last):\n")
        f.write("[1, 2]\n")  # JSON, but not one of our objects
    seen = attempts.seen_in_log(log_file)
    assert seen.count == 2, seen.lines  # neither stray line is taken for a notice, nor stops the count
    assert seen.gc_pauses and all(p >= 0 for p in seen.gc_pauses), seen.gc_pauses
    assert seen.lines[0].startswith("attempt timed out while running: week-1 issue_refund attempt 1")


def test_the_timed_out_line_says_when_the_first_beat_left_after_the_attempt_began():
    """The interceptor's line for an attempt the server timed out: the pump's first beat, on the same
    monotonic clock as the attempt's start, or that no beat left at all."""
    beat = Beat(HeartbeatPump(), lambda: None, 0.8, "week-1/issue_refund#1")
    began = time.monotonic()
    assert _beats(beat, began) == "the pump sent no beat"
    beat.sent, beat.first_sent = 3, began + 1.25
    assert _beats(beat, began) == "the pump sent 3 beats, the first 1.25 s after it reached the worker"
    assert _beats(None, began) == "no heartbeat timeout"
