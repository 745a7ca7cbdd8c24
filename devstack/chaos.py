"""Exactly-once under chaos: refund tickets through two worker processes that keep being
SIGKILLed and paused, against a Stripe edge that injects faults on a fraction of requests, while the
Temporal server, the provider and the ledger's database go down and come back. A check on the world,
not on the model's replies.

    python -m devstack.chaos [--tickets 300] [--mode dedupe|passthrough|both] [--seed N] [--rate 10]
                             [--ledger sqlite|postgres] [--faults all|kind,kind,...]

For each edge mode it starts its own stack (Temporal dev server on a SQLite file + localstripe behind
the Stripe edge with a store file, free ports, a temporary folder; with `--ledger postgres` a database
of its own on 127.0.0.1:5432, dropped at the end), seeds the paid batch orders the tickets need,
starts two `worker.py` processes (STRIPE_TIMEOUT_SECONDS=1, STRIPE_PROCESSING_WINDOW_SECONDS=2.5:
the deployment's word for how late a request may still land at the provider, which must cover the
slow POST's hold minus the client timeout, plus a margin; EFFECT_LEASE_SECONDS=5) and then, at the
same time:

- starts the N refund tickets at `--rate` tasks per second (`chaos_tickets`, seeded): most refund
  their own order's item in full; some are a customer's second ticket for an item another ticket
  refunds (often at the same time); some refund part of an item (a split refund) and a later
  ticket the rest; so the ledger's budgets per item and per order are exercised across tasks;
- a killer (devstack/chaos_faults.py), every seeded 1-5 s, does one fault of a kind drawn from a
  deck that holds each kind asked for at least once a round: SIGKILL a random worker (restarted);
  SIGSTOP one and SIGCONT it 2-10 s later (a process that wakes up late, after its leases and
  heartbeats ran out); SIGSTOP both workers together; SIGKILL or SIGSTOP a worker at one of the
  product's own crash points (activities/faults.py, armed through CRASH_ARMED: between the ledger's
  claim and the refund POST, between the provider's accept and the settle, an activity's start or
  end, after a message is sent), restarted or woken like the others; SIGKILL the Temporal dev
  server and start it again on its file (every history kept); restart the provider's process (the
  edge and localstripe: SIGTERM, its store saved; see chaos_faults.py); and, on PostgreSQL, a
  failover: every connection to the run's database terminated (pg_terminate_backend) every 0.2 s
  for 1-3 s, since the shared server itself cannot be killed;
- the edge fires, on a seeded fraction of `POST /v1/refunds`, one of timeout_after_accept
  (answer after the client's 1 s timeout), error_after_commit, error_before_commit,
  drop_after_commit and drop_before_commit, and `slow` (held 2.5 s before it is forwarded: longer
  than the client's timeout, so the lookup right after the timeout cannot see it yet); and `slow`
  (0.4 s, under the client's timeout) on a fraction of `GET /v1/refunds` (the lookups and the
  refundable-amount check);
- `hold beyond window`: the 10th refund POST and 1% of the others are held lease + timeout + window
  + 2 s (10.5 s) before they are forwarded: they land after the settle horizon the workers were
  told to trust. The deployment's promise is broken on purpose; what is wanted there is a person
  asked (awaiting_human, an unknown outcome), never a second refund. The edge notes each such
  request's ticket, and the report gives the judge's word on each (end state, refunds at the
  provider, flagged or not). A second refund is a finding on a ticket that is not a control: the
  run fails.

Each fault kind asked for (`--faults`, all by default) is counted, and the run fails when one
happened fewer times than asked (at least once each): a run that did not do what it says proves
nothing.

A small share of the tickets (`--controls`, 5%, at least one) are negative controls: each is alone on
its order, and runs on a queue of its own served by a worker in this process that has the naive
refund tool (devstack/unsafe.py: a fresh idempotency key per attempt, "refund failed" on any error)
in place of ours. Each of its refund POSTs lands and then times out (the edge's first rule names
the controls' tasks), and it sends only while the provider is up: every control moves
money behind the ledger, and the model asks again after each "refund failed". The judge must flag
exactly those tickets.

The chaos lasts while tickets are being started and then until every task is settled (a final
state, or `awaiting_human`) and every kind asked for was drawn once, or `--chaos-tail` seconds
have passed. Then it reads the edge's
fault counters, lifts the faults (which, in dedupe mode, also makes the edge forget saved keys
like a fresh account: the tool must not rely on them), stops the killer, and polls every task
with a deadline until each is completed, dead_lettered, cancelled or awaiting_human, and each task
awaiting a person is at rest: no activity or workflow task of its own open and no timer due before
every worker has been stopped (`Restless`). A task that asked about an unknown outcome reads the world
again on a timer and, once a refund the edge held has landed, withdraws its question and runs on; a
worker stopped under it would leave it half done, and the judge would call it lost.

Then every worker is stopped (all at once), and the run waits until the ledger's longest settle horizon (and the
edge's longest hold, for what the naive tool sent) has passed: nothing can land at the provider any
more. Only then does the independent judge (devstack/judge/, which shares no code with the product)
read the world: every refund and payment at the provider over its HTTP API, the ledger's tables with
plain SQL, each task's end state from Temporal; and weigh it against what each ticket asked for, per
item, order, ticket and party (see devstack/judge/checks.py). The run passes ("exactly once: yes",
exit 0) only when no ticket is lost, the judge flags exactly the negative controls, no person was
asked about an intent already settled, and chaos actually happened (edge faults and worker kills,
and each fault kind asked for at least once).

Kill -> resume time, derived from the event histories (server timestamps; the server runs on
this machine, so they share the killer's wall clock). Each kill records the victim's pid, which is
the pid in a worker's identity (`pid@host`) and in its sticky queue's name (`pid@host-<uuid>`):

- an activity whose `ActivityTaskStarted` has attempt > 1 and whose `last_failure` is a
  heartbeat or start-to-close timeout, or `WorkerLost` (the liveness keeper failed it when its worker's
  process ended: infra/liveness.py), was interrupted by a dead worker; the event's time is when
  its final attempt started on a live worker (checked: it is the last attempt's start, not the
  first's). Its kill is the one between the activity's `ActivityTaskScheduled` and that start on
  the worker that completed the workflow task scheduling it (eager dispatch runs it there), else
  the first kill in that window. Retries whose last failure is an application error (an
  unverifiable provider answer) are the faults' doing, not the kills'.
- a `WorkflowTaskTimedOut` is a workflow task lost with a dead worker: start-to-close (it was
  running there: the pid of its `WorkflowTaskStarted` identity) or schedule-to-start (it sat on the
  dead worker's sticky queue: the pid in the queue's name). Its kill is that pid's. It resumes at
  the next `WorkflowTaskStarted`; for a sticky-queue task the delay includes the activity that
  ran meanwhile on the live worker, since the task could not go on before its workflow task ran.

The delay is resume time minus kill time, per interrupted step; the table gives p50 and p99
(nearest rank) for activities, workflow tasks and both. A timeout whose worker was not killed
(a live but starved worker that missed a heartbeat or a workflow task deadline) is counted
apart and left out of the figures; one in a window where its worker was paused (SIGSTOP) is
counted as a pause's.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.api.failure.v1 import Failure
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.worker import Worker

from activities.db import Database
from activities.payments import StripeGateway
from client import start_task
from core.models import Checkpoint, TaskInput, TaskResult, ToolInput, ToolResult
from core.names import STATUS_ATTR
from devstack.attempts import cause_of
from devstack.chaos_faults import KINDS, Kill, Killer, Outages, drop_database, run_database
from devstack.judge import Ticket, Verdict, judge, wait_until_quiet
from devstack.judge import table as judge_table
from devstack.judge.report import detail_lines
from devstack.polling import poll_until
from devstack.processes import WorkerProcess
from devstack.scenarios import batch_order, batch_ticket
from devstack.seed import seed_scenarios
from devstack.stack import STRIPE_API_KEY, Stack
from devstack.unsafe import naive_refund
from infra.exit import run_main
from infra.liveness import WORKER_LOST
from infra.settings import Settings
from worker import Extensions, build_worker

MODES = ("dedupe", "passthrough")
POST_FAULTS = ("timeout_after_accept", "error_after_commit", "error_before_commit", "drop_after_commit",
               "drop_before_commit", "slow")
# (label, edge stats key): the edge counts each fault, and each fault per method.
FAULT_KINDS = (*((f"{f} (POST)", f"{f}:POST") for f in POST_FAULTS), ("slow (GET)", "slow:GET"))
FINAL = ("completed", "dead_lettered", "cancelled")
SETTLED = (*FINAL, "awaiting_human")
CLIENT_TIMEOUT = 1.0
SLOW_POST_SECONDS = 2.5  # the provider holds a refund longer than the client waits for it
LEASE_SECONDS = 5.0  # the workers' EFFECT_LEASE_SECONDS: how long after its claim a request may leave
WORKERS = 2
BEYOND = "hold beyond window"  # an edge rule's label: a refund POST held past its whole settle horizon
# Every fault kind the run can be asked for: the killer's (devstack/chaos_faults.py) and the edge's hold.
ALL_KINDS = (*KINDS, BEYOND)
LEDGERS = ("sqlite", "postgres")


def fault_rules(post_probability: float = 0.07, slow_probability: float = 0.2,
                slow_seconds: float = 0.4, slow_post_seconds: float = SLOW_POST_SECONDS) -> list[dict[str, Any]]:
    """Each POST fault on its own fraction of refund POSTs (about 35% of them faulted in all)."""
    delays = {"timeout_after_accept": CLIENT_TIMEOUT + 1.0, "slow": slow_post_seconds}
    rules = [{"fault": fault, "method": "POST", "path": "/v1/refunds", "probability": post_probability,
              "delay_seconds": delays.get(fault, 0.0)}
             for fault in POST_FAULTS]
    rules.append({"fault": "slow", "method": "GET", "path": "/v1/refunds", "probability": slow_probability,
                  "delay_seconds": slow_seconds})
    return rules


def beyond_window_rules(window: float, controls: list[str], probability: float = 0.01,
                        nth: int = 10) -> list[dict[str, Any]]:
    """Refund POSTs the provider holds longer than the workers' processing window says it can: held
    LEASE + timeout + window + 2 s before they are forwarded, so each lands after its attempt's settle
    horizon (send-by + timeout + window), when the worker may already have looked, found nothing and
    gone on. The `nth` refund POST always, and `probability` of the others. Put first: they win. Not the
    negative `controls`' requests (their own rule, `control_rules`, has them)."""
    hold = {"fault": "slow", "method": "POST", "path": "/v1/refunds", "label": BEYOND, "skip_tasks": controls,
            "delay_seconds": LEASE_SECONDS + CLIENT_TIMEOUT + window + 2.0}
    return [{**hold, "nth": [nth]}, {**hold, "probability": probability}]


def control_rules(controls: list[str]) -> list[dict[str, Any]]:
    """Every refund POST of the negative `controls` (task ids) lands and then times out, as in incident 2.
    Put first, so no other rule keeps it from landing: a negative control whose requests never reached
    the provider would have done nothing for the judge to flag."""
    return [{"fault": "timeout_after_accept", "method": "POST", "path": "/v1/refunds", "tasks": controls,
             "delay_seconds": CLIENT_TIMEOUT + 1.0}]


def control_refund(unsafe: Settings, outages: Outages) -> Callable[..., Any]:
    """The naive refund tool, sent only while the provider is up (the killer restarts it): the controls
    show the judge a refund behind the ledger's back, not an outage."""
    naive = naive_refund(unsafe)

    @activity.defn(name="issue_refund")
    async def issue_refund(call: ToolInput) -> ToolResult:
        await asyncio.to_thread(outages.provider_up.wait, 120.0)
        return await naive(call)
    return issue_refund


def worker_env(slow_post_seconds: float = SLOW_POST_SECONDS) -> dict[str, str]:
    """The workers' provider terms. The processing window (how late a request may still land, as this
    deployment configures it) covers the slow POST's hold past the client timeout, plus a margin."""
    window = max(0.0, slow_post_seconds - CLIENT_TIMEOUT) + 1.0
    return {"STRIPE_TIMEOUT_SECONDS": str(CLIENT_TIMEOUT), "STRIPE_PROCESSING_WINDOW_SECONDS": str(window),
            "STRIPE_HONOURS_KEYS": "false", "RECONCILE_EVERY_MINUTES": "0", "EFFECT_LEASE_SECONDS": str(LEASE_SECONDS)}


def slow_post_seconds(rules: list[dict[str, Any]]) -> float:
    """The longest hold of a `slow` rule on refund POSTs that the window is to cover (0 without one): the
    holds beyond the window are left out, they are there to exceed it."""
    return max((r.get("delay_seconds", 0.0) for r in rules
                if r["fault"] == "slow" and r.get("method") == "POST" and r.get("label") != BEYOND), default=0.0)


def longest_hold(rules: list[dict[str, Any]]) -> float:
    """The longest any rule holds a request: after it, nothing the edge held can still land."""
    return max((r.get("delay_seconds", 0.0) for r in rules), default=0.0)


# --- the tickets ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChaosTicket:
    task: TaskInput
    order: int          # batch_order(order)
    kind: str           # first / second (the same item again, in full) / split (a part) / rest (the rest)
    amount_cents: int
    control: bool = False  # a negative control: run through the naive refund tool, the judge must flag it


def chaos_tickets(count: int, rng: random.Random) -> list[ChaosTicket]:
    """`count` tickets over batch orders 1..k, seeded: about 10% a second ticket for an item a recent
    ticket refunds (full price again), 10% a split refund (a part of a new order's item) and, while a
    split is open, 10% the rest of it; the others refund their own new order's item in full."""
    tickets: list[ChaosTicket] = []
    orders: list[int] = []
    open_splits: list[tuple[int, int]] = []  # (order, the rest in cents)

    def ticket(order: int, kind: str, cents: int) -> ChaosTicket:
        task = batch_ticket(order, amount_cents=cents)
        if kind != "first":  # a task id of its own; the order and item are the first ticket's
            task = task.model_copy(update={"task_id": f"{task.task_id}-{kind}-{len(tickets) + 1}"})
        return ChaosTicket(task, order, kind, cents)

    for _ in range(count):
        draw = rng.random()
        if draw < 0.10 and orders:
            order = rng.choice(orders[-20:])  # recent: often still running, so the two race
            tickets.append(ticket(order, "second", price(order)))
            continue
        if draw < 0.20 and open_splits:
            order, rest = open_splits.pop(0)
            tickets.append(ticket(order, "rest", rest))
            continue
        order = len(orders) + 1
        orders.append(order)
        if draw < 0.30:
            part = round(price(order) * rng.uniform(0.3, 0.7))
            open_splits.append((order, price(order) - part))
            tickets.append(ticket(order, "split", part))
        else:
            tickets.append(ticket(order, "first", price(order)))
    return tickets


def with_controls(plan: list[ChaosTicket], share: float, rng: random.Random) -> list[ChaosTicket]:
    """Mark `share` of the tickets (at least one when share > 0) as negative controls, seeded. Only a ticket
    alone on its order qualifies: the naive tool's duplicates must not spill onto another ticket's item,
    or the judge would rightly flag that ticket too."""
    per_order = Counter(t.order for t in plan)
    alone = [n for n, t in enumerate(plan) if t.kind == "first" and per_order[t.order] == 1]
    count = min(len(alone), max(1, round(share * len(plan)))) if share > 0 else 0
    picked = set(rng.sample(alone, count))
    return [dataclasses.replace(t, control=True) if n in picked else t for n, t in enumerate(plan)]


def judged(ticket: ChaosTicket) -> Ticket:
    """What the judge expects of a ticket: its order's item refunded by the amount it asks."""
    order = batch_order(ticket.order)
    return Ticket(ticket.task.task_id, order_id=order.order_id, item_id=order.items[0].item_id,
                  refund_cents=ticket.amount_cents, control=ticket.control)


def price(order: int) -> int:
    return batch_order(order).items[0].amount_cents


def edge_call(base_url: str, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base_url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


# --- task states ---------------------------------------------------------------------------------


async def task_state(handle: WorkflowHandle) -> tuple[str | None, str]:
    """(state, note): completed / dead_lettered / cancelled / awaiting_human, `failed:<status>` for
    a run that ended outside our states, None while it still runs (or cannot be asked right now)."""
    try:
        described = await handle.describe(rpc_timeout=_seconds(5))
    except RPCError:
        return None, ""
    status = described.status
    if status == WorkflowExecutionStatus.COMPLETED:
        result: TaskResult = await handle.result(rpc_timeout=_seconds(10))
        return result.state, result.checkpoint.dead_letter_reason or ""
    if status != WorkflowExecutionStatus.RUNNING:
        return f"failed:{status.name.lower() if status else 'unknown'}", ""
    # Running: the checkpoint query says whether it waits for a person. The AgentStatus search
    # attribute (upserted with the state) spares a query to every task that is plainly running.
    if described.typed_search_attributes.get(STATUS_ATTR) != "awaiting_human":
        return None, ""
    try:
        cp: Checkpoint = await handle.query("checkpoint", result_type=Checkpoint, rpc_timeout=_seconds(5))
    except RPCError:
        return None, ""
    if cp.state != "awaiting_human" or cp.waiting_for is None:
        return None, ""
    wait = cp.waiting_for
    trail = "; ".join(f"{name}: {' / '.join(step.trail)}" for name, step in cp.steps.items() if step.intent_key)
    return cp.state, f"{wait.reason} on {wait.tool}: {wait.detail} [{trail}]"


def _seconds(s: float) -> timedelta:
    return timedelta(seconds=s)


class Tracker:
    """The settled state of each started task, refreshed by polling."""

    def __init__(self) -> None:
        self.handles: dict[str, WorkflowHandle] = {}
        self.states: dict[str, str] = {}
        self.notes: dict[str, str] = {}
        self._sem = asyncio.Semaphore(16)

    async def refresh(self) -> int:
        """Poll the tasks not yet in a final state; returns how many are settled."""
        async def one(task_id: str, handle: WorkflowHandle) -> None:
            async with self._sem:
                state, note = await task_state(handle)
            if state is not None:
                self.states[task_id] = state
                self.notes[task_id] = note
            else:
                self.states.pop(task_id, None)
        pending = [(t, h) for t, h in self.handles.items() if self.states.get(t) not in FINAL]
        await asyncio.gather(*(one(t, h) for t, h in pending))
        return sum(1 for s in self.states.values() if s in SETTLED)


class Restless:
    """Which tasks awaiting a person would still act on their own while the workers are being stopped. Such a
    task reads the world again on a timer (workflows/_agent.py `_recheck`, at doubling intervals) and,
    when a refund that was held has landed, withdraws its question and runs on: stopped under it, it is left
    half done, and the judge reads it as lost. A task is at rest when its history has no activity and no
    workflow task open and no timer due before `until` (a timer that fires once every worker is gone wakes
    nothing: the task still waits for its person)."""

    def __init__(self, tracker: Tracker) -> None:
        self._tracker = tracker
        self._sem = asyncio.Semaphore(16)
        self.waited: set[str] = set()  # the tasks found restless at least once

    async def tasks(self, until: float) -> list[str]:
        waiting = [t for t, s in self._tracker.states.items() if s == "awaiting_human"]
        restless = await asyncio.gather(*(self._restless(self._tracker.handles[t], until) for t in waiting))
        found = [t for t, r in zip(waiting, restless, strict=True) if r]
        self.waited.update(found)
        return found

    async def _restless(self, handle: WorkflowHandle, until: float) -> bool:
        activities: set[int] = set()
        timers: dict[str, float] = {}  # timer id -> when it fires
        workflow_task = False
        try:
            async with self._sem:
                async for event in handle.fetch_history_events(rpc_timeout=_seconds(10)):
                    kind = event.event_type
                    if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                        activities.add(event.event_id)
                    elif kind in _ACTIVITY_CLOSED:
                        activities.discard(getattr(event, _ACTIVITY_CLOSED[kind]).scheduled_event_id)
                    elif kind == EventType.EVENT_TYPE_TIMER_STARTED:
                        started = event.timer_started_event_attributes
                        timers[started.timer_id] = _ts(event) + started.start_to_fire_timeout.ToMicroseconds() / 1e6
                    elif kind in (EventType.EVENT_TYPE_TIMER_FIRED, EventType.EVENT_TYPE_TIMER_CANCELED):
                        closed = (event.timer_fired_event_attributes if kind == EventType.EVENT_TYPE_TIMER_FIRED
                                  else event.timer_canceled_event_attributes)
                        timers.pop(closed.timer_id, None)
                    elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
                        workflow_task = True
                    elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                        workflow_task = False
        except RPCError:
            return True  # not known now (a server restarting): asked again at the next poll
        return bool(activities) or workflow_task or any(at < until for at in timers.values())


_ACTIVITY_CLOSED = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: "activity_task_completed_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: "activity_task_failed_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "activity_task_timed_out_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED: "activity_task_canceled_event_attributes",
}
STOPPING = 10.0  # seconds from the check that every task is at rest until every worker has had SIGTERM, at most


# --- kill -> resume from histories ---------------------------------------------------------------


def _ts(event) -> float:
    return event.event_time.ToMicroseconds() / 1e6


def _pid(identity: str) -> int | None:
    """The process id in a worker identity or sticky queue name (`4804@host`, `4804@host-<uuid>`)."""
    head = identity.split("@", 1)[0]
    return int(head) if head.isdigit() else None


# A pause explains a timeout up to this long after SIGCONT (the longest of the workflow task timeout,
# 3 s, the sticky-queue timeout, WORKER_STICKY_TIMEOUT_SECONDS 10 s, and the tool heartbeat timeout, with
# room): later ones are a busy worker's.
PAUSE_REACH = 12.0


def _explains(kill: Kill, at: float) -> bool:
    """A kill explains a timeout of its pid any time after it (the process is gone); a pause only
    while the process was stopped and shortly after it woke up."""
    return kill.at <= at and (not kill.paused_for or at <= kill.at + kill.paused_for + PAUSE_REACH)


def _interrupted(failure: Failure) -> bool:
    """An attempt's end that a dead or paused worker explains: the server timed it out (heartbeat,
    start-to-close), or the liveness keeper failed it when its worker's process ended."""
    if failure.HasField("application_failure_info"):
        return failure.application_failure_info.type == WORKER_LOST
    return failure.HasField("timeout_failure_info") and failure.timeout_failure_info.timeout_type in (
        TimeoutType.TIMEOUT_TYPE_HEARTBEAT, TimeoutType.TIMEOUT_TYPE_START_TO_CLOSE)


# A workflow task completion a worker sent just before it was killed or stopped reaches the server
# this long after at most (1-8 ms seen): an activity it scheduled later is not the kill's.
IN_FLIGHT = 1.0
HANDED_TO_DEAD = "handed_to_dead"


def resumptions(events: list, kills: list[Kill]) -> tuple[list[tuple[str, float, float]], list[tuple[str, float]]]:
    """(kind, kill time, seconds from kill to resume) per interrupted step of one history, and
    (description, time) of each timeout that no kill explains. `kills` may hold pauses too: a step
    whose timeout a pause explains is of kind `paused`. Kind `handed_to_dead`: an activity scheduled by
    the completion a worker had in flight as it was killed, which the server handed back to it."""
    found: list[tuple[str, float, float]] = []
    unattributed: list[tuple[str, float]] = []
    by_id = {e.event_id: e for e in events}
    for i, event in enumerate(events):
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = event.activity_task_started_event_attributes
            failure = attrs.last_failure
            if attrs.attempt <= 1 or not _interrupted(failure):
                continue
            scheduled = by_id.get(attrs.scheduled_event_id)
            lo = _ts(scheduled) if scheduled else 0.0
            # Eager dispatch runs an activity on the worker that completed the workflow task scheduling it.
            completer = next((e for e in reversed(events[:attrs.scheduled_event_id])
                              if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED), None)
            pid = _pid(completer.workflow_task_completed_event_attributes.identity) if completer else None
            # A kill after the scheduling explains the timeout, whichever worker ran the attempt (a history
            # does not name a failed attempt's worker); so does a kill of the completer just before it: its
            # completion was still in flight, and the server handed the new activity back to the dead worker.
            candidates = [k for k in kills if _explains(k, _ts(event))
                          and (lo <= k.at or (k.pid == pid and lo <= k.at + IN_FLIGHT))]
            kill = next((k for k in candidates if k.pid == pid), candidates[0] if candidates else None)
            if kill is None:
                name = scheduled.activity_task_scheduled_event_attributes.activity_type.name if scheduled else "?"
                unattributed.append((f"activity {name} {cause_of(failure)}", _ts(event)))
            else:
                kind = "paused" if kill.paused_for else "activity" if lo <= kill.at else HANDED_TO_DEAD
                found.append((kind, kill.at, _ts(event) - kill.at))
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
            attrs = event.workflow_task_timed_out_event_attributes
            resumed = next((e for e in events[i + 1:]
                            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED), None)
            if resumed is None:
                continue
            if attrs.timeout_type == TimeoutType.TIMEOUT_TYPE_START_TO_CLOSE:
                # It was running on a worker that died: the started event names that worker.
                started = by_id.get(attrs.started_event_id)
                pid = _pid(started.workflow_task_started_event_attributes.identity) if started else None
            else:
                # Schedule-to-start: it waited on a sticky queue, named after its (dead) worker.
                scheduled = by_id.get(attrs.scheduled_event_id)
                pid = _pid(scheduled.workflow_task_scheduled_event_attributes.task_queue.name) if scheduled else None
            kill = max((k for k in kills if k.pid == pid and k.at <= _ts(event)), key=lambda k: k.at, default=None)
            if kill is not None and not _explains(kill, _ts(event)):
                kill = None  # its last pause ended long before: a busy worker's timeout
            if kill is None:
                unattributed.append((f"workflow task {TimeoutType.Name(attrs.timeout_type)}", _ts(event)))
            else:
                found.append(("paused" if kill.paused_for else "workflow_task", kill.at, _ts(resumed) - kill.at))
    return found, unattributed


# --- one run -------------------------------------------------------------------------------------


@dataclass
class ChaosReport:
    mode: str
    tasks: int
    kills: int
    faults: dict[str, int]
    pauses: int
    tickets: Counter              # per kind: first / second / split / rest
    controls: int                 # tickets run through the naive refund tool
    verdict: Verdict              # the independent judge's (devstack/judge/), on the quiet world
    resume: dict[str, list[float]]
    unattributed_timeouts: list[str]
    paused_timeouts: int
    unexpected_worker_exits: int
    stop_exit_codes: list[int | None]
    seconds: dict[str, float]
    data_dir: str = ""
    ledger: str = "sqlite"
    asked: dict[str, int] = dataclasses.field(default_factory=dict)   # fault kind -> at least this many
    happened: dict[str, int] = dataclasses.field(default_factory=dict)  # fault kind -> how many
    aimed: dict[str, int] = dataclasses.field(default_factory=dict)   # "<point> <SIGNAL>" -> fired
    aim_missed: int = 0           # crash points armed and not reached in time (disarmed)
    connections_cut: int = 0      # ledger connections terminated
    held: dict[str, str] = dataclasses.field(default_factory=dict)    # task held beyond the window -> outcome
    # restart kind -> each outage, stop to ready, in s: the drawn 1-3 s down plus the stop and the start,
    # which a busy machine makes longer
    outages: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    @property
    def chaos_happened(self) -> bool:
        """A run without a fault at the edge or a killed worker proves nothing, whatever the judge says."""
        return sum(self.faults.values()) > 0 and self.kills > 0

    @property
    def short(self) -> dict[str, tuple[int, int]]:
        """Fault kinds that happened fewer times than asked: kind -> (happened, asked)."""
        return {k: (self.happened.get(k, 0), n) for k, n in self.asked.items() if self.happened.get(k, 0) < n}

    @property
    def passed(self) -> bool:
        return self.verdict.ok and self.chaos_happened and not self.short

    def why_not(self) -> list[str]:
        v = self.verdict
        reasons = [f"{len(v.lost)} tickets lost"] if v.lost else []
        if v.flagged != v.controls:
            reasons.append(f"flagged {len(v.flagged & v.controls)} of {len(v.controls)} negative controls and "
                           f"{len(v.flagged - v.controls)} other tickets")
        if v.settled_escalations:
            reasons.append(f"{len(v.settled_escalations)} escalations about settled intents")
        if not self.chaos_happened:
            reasons.append(f"no chaos: {sum(self.faults.values())} edge faults, {self.kills} kills")
        for kind, (happened, asked) in self.short.items():
            reasons.append(f"fewer faults than asked: {kind} {happened} of at least {asked}")
        return reasons


def held_outcome(verdict: Verdict, task_id: str) -> str:
    """What the judge saw of a ticket whose refund POST was held beyond the window: its end state, how
    many refunds the provider holds for it, and whether it was flagged (a second payment would be)."""
    t = verdict.tickets.get(task_id)
    if t is None:
        return "not a ticket of the run"
    cause = next((c for c in t.causes if c.startswith("escalation")), "")
    flag = "flagged: " + ", ".join(sorted({f.kind for f in t.findings})) if t.findings else "not flagged"
    control = "negative control: " if t.ticket.control else ""
    return f"{control}{t.end.state}, {len(t.money)} refund(s) at the provider, {flag}" + (f"; {cause}" if cause else "")


async def run_chaos(mode: str, tickets: int, seed: int, data_dir: Path, rate: float = 10.0,
                    chaos_tail: float = 60.0, settle_timeout: float = 180.0,
                    say: Callable[[str], None] = print, rules: list[dict[str, Any]] | None = None,
                    controls: float = 0.05, kinds: tuple[str, ...] | None = None,
                    ledger: str = "sqlite", every: tuple[float, float] = (1.0, 5.0),
                    pause: tuple[float, float] = (2.0, 10.0)) -> ChaosReport:
    """One chaos run in one edge mode on its own stack in data_dir; returns what it found. `controls`:
    the share of tickets run through the naive refund tool (negative controls). `kinds`: the fault kinds
    asked for (ALL_KINDS; each must happen at least once), by default every kind the ledger allows.
    `ledger`: sqlite (a file in data_dir) or postgres (a database of its own on 127.0.0.1:5432). `every`:
    seconds between faults (drawn), `pause`: how long a paused worker stays stopped (drawn)."""
    await asyncio.to_thread(data_dir.mkdir, parents=True, exist_ok=True)
    rng = random.Random(seed)
    plan = with_controls(chaos_tickets(tickets, random.Random(rng.random())), controls, random.Random(seed + 1))
    kinds = tuple(k for k in ALL_KINDS if k != "ledger connections cut" or ledger == "postgres") \
        if kinds is None else kinds
    rules = fault_rules() if rules is None else rules
    env = worker_env(slow_post_seconds(rules))
    window = float(env["STRIPE_PROCESSING_WINDOW_SECONDS"])
    control_tasks = [t.task.task_id for t in plan if t.control]
    if BEYOND in kinds and not any(r.get("label") == BEYOND for r in rules):
        rules = [*beyond_window_rules(window, control_tasks), *rules]
    if control_tasks:
        rules = [*control_rules(control_tasks), *rules]
    stack = Stack.for_tests(data_dir)
    t0 = time.monotonic()
    database = await asyncio.to_thread(run_database, ledger, stack.agent_db, f"chaos_{mode}_{os.getpid()}")
    await asyncio.to_thread(stack.start)
    slots: list[WorkerProcess] = []
    naive: Worker | None = None
    try:
        seconds = {"stack_start": time.monotonic() - t0}
        edge_call(stack.stripe_url, "PUT", "/_edge/config", {"mode": mode, "rules": []})
        db = Database(database)
        gateway = StripeGateway(STRIPE_API_KEY, stack.stripe_url, 10.0)
        t = time.monotonic()
        await asyncio.to_thread(seed_scenarios, db, gateway, max(t.order for t in plan))
        seconds["seed"] = time.monotonic() - t
        if ledger == "postgres":
            env["DATABASE_URL"] = database
        settings = Settings(temporal_address=stack.address, task_queue=stack.task_queue,
                            stripe_api_base=stack.stripe_url, stripe_api_key=STRIPE_API_KEY,
                            agent_db_path=stack.agent_db, stripe_timeout_seconds=CLIENT_TIMEOUT,
                            stripe_processing_window_seconds=window, effect_lease_seconds=LEASE_SECONDS,
                            reconcile_every_minutes=0,
                            **({"database_url": database} if ledger == "postgres" else {}))
        edge_config = {"mode": mode, "rules": rules, "seed": seed}
        outages = Outages(stack, edge_config, database.rsplit("/", 1)[-1] if ledger == "postgres" else None)
        killer = Killer(stack, slots, env, random.Random(rng.random()), data_dir,
                        kinds=tuple(k for k in kinds if k in KINDS), outages=outages, min_s=every[0],
                        max_s=every[1], pause_s=pause)
        started = await asyncio.gather(*(asyncio.to_thread(stack.start_worker, data_dir / f"worker-{n + 1}.log",
                                                           killer.worker_env(n)) for n in range(WORKERS)))
        slots.extend(started)
        client = await Client.connect(stack.address, data_converter=pydantic_data_converter)
        # The negative controls' worker: in this process, on its own queue, the naive tool in place of
        # ours (as `starter.py compare` runs it). The killer leaves it alone; the edge's faults do not.
        unsafe = settings.model_copy(update={"task_queue": f"{stack.task_queue}-unsafe"})
        naive = build_worker(client, unsafe, unsafe.task_queue,
                             extensions=Extensions(replace=[control_refund(unsafe, outages)]))
        naive_run = asyncio.create_task(naive.run())

        edge_call(stack.stripe_url, "PUT", "/_edge/config", edge_config)
        tracker = Tracker()
        chaos_started = time.monotonic()
        killer.start()
        say(f"[{mode}] chaos: {tickets} tickets ({sum(t.control for t in plan)} negative controls) at {rate:g}/s, "
            f"2 workers, {ledger} ledger, a fault every 1-5 s ({', '.join(kinds)}), edge faults on; the workers' "
            f"STRIPE_PROCESSING_WINDOW_SECONDS={window:g} covers a {slow_post_seconds(rules):g} s provider hold "
            f"past the {CLIENT_TIMEOUT:g} s client timeout")
        for n, ticket in enumerate(plan, start=1):
            task = ticket.task
            tracker.handles[task.task_id] = await _start(client, unsafe if ticket.control else settings, task)
            if n % max(1, int(rate)) == 0:
                await asyncio.sleep(max(0.0, chaos_started + n / rate - time.monotonic()))  # the start rate
        seconds["starting"] = time.monotonic() - chaos_started
        try:  # the chaos goes on until every task is settled and each fault kind was drawn, or for the tail
            await poll_until(lambda: _chaos_done(tracker, tickets, killer), "every task to settle", chaos_tail, 1.0)
        except TimeoutError:
            pass
        seconds["chaos"] = time.monotonic() - chaos_started

        await killer.stop()
        await asyncio.to_thread(outages.take_edge_counts)
        faults = {k.removeprefix("fault:"): v for k, v in outages.edge_stats.items() if k.startswith("fault:")}
        edge_call(stack.stripe_url, "PUT", "/_edge/config", {"mode": mode, "rules": []})
        say(f"[{mode}] killer stopped after {dict(killer.counts)}, faults lifted; waiting for every task")

        # What the edge held when the faults lifted has landed by `landed_by`.
        landed_by = time.time() + longest_hold(rules) + CLIENT_TIMEOUT
        restless = Restless(tracker)
        t = time.monotonic()
        try:
            await poll_until(lambda: _all_settled(tracker, tickets, restless), "every task to settle and rest",
                             settle_timeout, 1.0)
            settled = f"settled after {time.monotonic() - t:.0f} s"
        except TimeoutError:  # the judge names what did not settle: lost
            settled = f"NOT settled within {settle_timeout:.0f} s"
        seconds["settle"] = time.monotonic() - t
        say(f"[{mode}] {settled}; {len(restless.waited)} task(s) awaiting a person were waited for until no "
            "timer of theirs could fire before the workers are stopped")
        killer.check_alive()

        # The judge reads a quiet world: every worker stopped, then the longest settle horizon waited out
        # (and the edge's longest hold, for what the naive tool, which keeps no ledger, may have sent).
        # All at once: a worker left serving while another stops could take a timer the rest check counted out.
        codes, _ = await asyncio.gather(asyncio.gather(*(asyncio.to_thread(worker.stop) for worker in slots)),
                                        naive.shutdown())
        await naive_run
        naive = None
        t = time.monotonic()
        await wait_until_quiet(database, at_least_until=landed_by)
        seconds["quiet"] = time.monotonic() - t
        say(f"[{mode}] every worker stopped, settle horizons passed; judging")
        verdict = await judge([judged(t) for t in plan], provider_url=stack.stripe_url, api_key=STRIPE_API_KEY,
                              database=database, client=client)
        resume, unattributed, paused = await _resume_figures(client, list(tracker.handles), killer, data_dir)
        happened = {**killer.counts, BEYOND: faults.get(BEYOND, 0)}
        held = {str(m["task_id"]): held_outcome(verdict, str(m["task_id"]))
                for m in outages.edge_marked if m.get("label") == BEYOND}
        return ChaosReport(
            mode=mode, tasks=len(plan), kills=len(killer.kills), faults=faults, pauses=len(killer.pauses),
            tickets=Counter(t.kind for t in plan), controls=sum(t.control for t in plan), verdict=verdict,
            resume=resume, unattributed_timeouts=unattributed, paused_timeouts=paused,
            unexpected_worker_exits=len(killer.unexpected), stop_exit_codes=codes,
            seconds={**seconds, "total": time.monotonic() - t0}, data_dir=str(data_dir), ledger=ledger,
            asked=dict.fromkeys(kinds, 1), happened=happened, aimed=dict(killer.aimed),
            aim_missed=sum(killer.missed.values()), connections_cut=outages.connections_cut, held=held,
            outages={k: list(v) for k, v in outages.down_seconds.items()})
    finally:
        if naive is not None:
            await naive.shutdown()
        await asyncio.to_thread(stack.stop)
        await asyncio.to_thread(drop_database, database)


async def _start(client: Client, settings: Settings, task: TaskInput, timeout: float = 60.0) -> WorkflowHandle:
    """Start a task; while the Temporal server is being restarted, again until it answers (deadline)."""
    async def attempt() -> WorkflowHandle | None:
        try:
            return await start_task(client, settings, task)
        except RPCError:
            return None
    return await poll_until(attempt, f"the start of {task.task_id}", timeout, 0.2)


async def _chaos_done(tracker: Tracker, tickets: int, killer: Killer) -> bool:
    return killer.first_round_done and await _all_settled(tracker, tickets)


async def _all_settled(tracker: Tracker, tickets: int, restless: Restless | None = None) -> bool:
    """Every task settled; with `restless`, also every task awaiting a person at rest until the workers are
    stopped, and the states read again after that (a task that acted meanwhile shows it there)."""
    if await tracker.refresh() < tickets:
        return False
    if restless is None:
        return True
    waiting = {t for t, s in tracker.states.items() if s == "awaiting_human"}
    if await restless.tasks(time.time() + STOPPING):
        return False
    return await tracker.refresh() >= tickets and waiting == {t for t, s in tracker.states.items()
                                                              if s == "awaiting_human"}


async def _resume_figures(client: Client, task_ids: list[str], killer: Killer, data_dir: Path | None = None
                          ) -> tuple[dict[str, list[float]], list[str], int]:
    """Kill -> resume delays per kind of step, the timeouts no kill explains, and the timeouts of a pause."""
    resume: dict[str, list[float]] = {"activity": [], "workflow_task": []}
    unattributed: list[tuple[str, float]] = []
    per_step: list[dict[str, Any]] = []
    sem = asyncio.Semaphore(16)

    async def history(handle: WorkflowHandle):
        async with sem:
            return await handle.fetch_history()
    histories = await asyncio.gather(*(history(client.get_workflow_handle(t)) for t in task_ids))
    paused = 0
    for task_id, h in zip(task_ids, histories, strict=True):
        found, missed = resumptions(list(h.events), sorted(killer.kills + killer.pauses, key=lambda k: k.at))
        unattributed += missed
        for kind, kill, delay in found:
            per_step.append({"task_id": task_id, "kind": kind, "kill": kill, "delay": round(delay, 3)})
            if kind == "paused":  # its worker stopped and woke up: not a kill -> resume figure
                paused += 1
            else:
                resume["activity" if kind == HANDED_TO_DEAD else kind].append(delay)
    if data_dir is not None:
        (data_dir / "kills.json").write_text(json.dumps({"kills": [k.__dict__ for k in killer.kills],
                                                         "pauses": [p.__dict__ for p in killer.pauses]}, indent=1))
        (data_dir / "resumptions.json").write_text(json.dumps(
            {"resumed": per_step, "unattributed": [{"timeout": d, "at": at} for d, at in unattributed]}, indent=1))
    return resume, [d for d, _ in unattributed], paused


# --- the table -----------------------------------------------------------------------------------


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _kind_of(outcome: str) -> str:
    """A held ticket's outcome without its escalation's text (held_outcome's first three parts)."""
    return outcome.split(";", 1)[0]


def table(reports: list[ChaosReport]) -> str:
    """The run's figures per edge mode; the judge's own table follows it in `main` (judge_table)."""
    def row(label: str, cells: list[Any]) -> str:
        return f"| {label} | " + " | ".join(str(c) for c in cells) + " |"

    def ends(state: str) -> list[int]:
        return [sum(1 for t in r.verdict.tickets.values() if (t.end.lost and state == "lost") or t.end.state == state)
                for r in reports]

    out = [row("edge mode", [r.mode for r in reports]), "|---|" + "---|" * len(reports)]
    out.append(row("tickets: own item in full / second for a refunded item / split part / split rest",
                   [" / ".join(str(r.tickets.get(k, 0)) for k in ("first", "second", "split", "rest"))
                    for r in reports]))
    out.append(row("negative controls (the naive refund tool, its own queue)", [r.controls for r in reports]))
    out.append(row("ledger", [r.ledger for r in reports]))
    out.append(row("worker kills in all (SIGKILL, restarted; random and aimed)", [r.kills for r in reports]))
    out.append(row("worker pauses in all (SIGSTOP, SIGCONT after 2-10 s; random, aimed, both)",
                   [r.pauses for r in reports]))
    for kind in ALL_KINDS:
        out.append(row(f"**fault: {kind}** (happened / asked at least)",
                       [f"{r.happened.get(kind, 0)} / {r.asked[kind]}" if kind in r.asked else "off"
                        for r in reports]))
    points = sorted({p for r in reports for p in r.aimed})
    for point in points:
        out.append(row(f"aimed at crash point: {point}", [r.aimed.get(point, 0) for r in reports]))
    out.append(row("aimed crash points armed and not reached in time (disarmed, drawn again)",
                   [r.aim_missed for r in reports]))
    for kind in ("temporal restart", "provider restart"):
        out.append(row(f"{kind}: outages, longest s (stop to ready)",
                       [f"{len(r.outages.get(kind, []))}, {max(r.outages.get(kind, []), default=0):.1f}"
                        for r in reports]))
    out.append(row("ledger connections terminated (pg_terminate_backend)",
                   [r.connections_cut if r.ledger == "postgres" else "-" for r in reports]))
    for label, key in FAULT_KINDS:
        out.append(row(f"faults: {label} /v1/refunds", [r.faults.get(key, 0) for r in reports]))
    outcomes = sorted({_kind_of(o) for r in reports for o in r.held.values()})
    for outcome in outcomes:
        out.append(row(f"tickets held beyond the window: {outcome}",
                       [sum(_kind_of(o) == outcome for o in r.held.values()) for r in reports]))
    for state in ("completed", "awaiting_human", "dead_lettered", "cancelled"):
        out.append(row(state, ends(state)))
    out.append(row("**lost** (must be 0)", ends("lost")))
    out.append(row("provider refunds of the tickets' orders", [r.verdict.provider_refunds for r in reports]))
    for status in ("too many", "too few", "wrong amount"):
        out.append(row(f"items refunded {status} (negative controls included)",
                       [sum(1 for m in r.verdict.items.values() if m.status == status) for r in reports]))
    out.append(row("**tickets flagged by the judge: negative controls / others** (all / 0)",
                   [f"{len(r.verdict.flagged & r.verdict.controls)} of {r.controls} / "
                    f"{len(r.verdict.flagged - r.verdict.controls)}" for r in reports]))
    out.append(row("**escalations about settled intents** (must be 0)",
                   [len(r.verdict.settled_escalations) for r in reports]))
    both = {r.mode: r.resume["activity"] + r.resume["workflow_task"] for r in reports}
    out.append(row("interrupted steps resumed: activities / workflow tasks",
                   [f"{len(r.resume['activity'])} / {len(r.resume['workflow_task'])}" for r in reports]))
    out.append(row("kill -> resume, all steps: p50 / p99 s",
                   [f"{_fmt(percentile(both[r.mode], 50))} / {_fmt(percentile(both[r.mode], 99))}" for r in reports]))
    for kind, label in (("activity", "activities"), ("workflow_task", "workflow tasks")):
        out.append(row(f"kill -> resume, {label}: p50 / p99 s",
                       [f"{_fmt(percentile(r.resume[kind], 50))} / {_fmt(percentile(r.resume[kind], 99))}"
                        for r in reports]))
    out.append(row("timeouts of a paused worker (not in the figures above)", [r.paused_timeouts for r in reports]))
    out.append(row("timeouts no kill or pause explains (a busy worker; not in the figures above)",
                   [len(r.unattributed_timeouts) for r in reports]))
    out.append(row("unexpected worker exits (not killed by us)", [r.unexpected_worker_exits for r in reports]))
    out.append(row("wall time: chaos / settle after lifting / quiet (horizons) / total s",
                   [f"{r.seconds.get('chaos', 0):.0f} / {r.seconds.get('settle', 0):.0f} / "
                    f"{r.seconds.get('quiet', 0):.0f} / {r.seconds.get('total', 0):.0f}" for r in reports]))
    return "\n".join(out)


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tickets", type=int, default=300)
    parser.add_argument("--mode", choices=[*MODES, "both"], default="both")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=10.0, help="tickets started per second")
    parser.add_argument("--chaos-tail", type=float, default=120.0,
                        help="seconds of chaos after the last start, at most, before the faults are lifted")
    parser.add_argument("--settle-timeout", type=float, default=180.0)
    parser.add_argument("--keep", action="store_true", help="keep the data folder (logs, databases)")
    parser.add_argument("--controls", type=float, default=0.05,
                        help="share of tickets run through the naive refund tool as negative controls (the judge "
                             "must flag exactly those; at least one when above 0)")
    parser.add_argument("--details", action="store_true",
                        help="also list the judge's findings on the negative controls (they are counted either way)")
    parser.add_argument("--ledger", choices=LEDGERS, default="sqlite",
                        help="the ledger's database: a SQLite file, or a PostgreSQL database of the run's own on "
                             "127.0.0.1:5432 (its connections are cut during the run)")
    parser.add_argument("--faults", default="all",
                        help="comma-separated fault kinds asked for, each at least once (all: every kind the "
                             f"ledger allows): {', '.join(ALL_KINDS)}")
    args = parser.parse_args(argv)
    kinds = None if args.faults == "all" else tuple(k.strip() for k in args.faults.split(",") if k.strip())
    if kinds is not None and set(kinds) - set(ALL_KINDS):
        parser.error(f"unknown fault kinds: {', '.join(sorted(set(kinds) - set(ALL_KINDS)))}")
    modes = list(MODES) if args.mode == "both" else [args.mode]
    root = Path(tempfile.mkdtemp(prefix="chaos-"))
    reports = []
    try:
        for mode in modes:
            reports.append(await run_chaos(mode, args.tickets, args.seed, root / mode, args.rate,
                                           args.chaos_tail, args.settle_timeout, controls=args.controls,
                                           kinds=kinds, ledger=args.ledger))
    finally:
        keep = args.keep or any(not r.passed for r in reports) or len(reports) < len(modes)
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    print()
    print(f"Chaos run: {args.tickets} refund tickets per mode, seed {args.seed}, {args.rate:g} starts/s, "
          f"2 worker processes, {args.ledger} ledger, {sys.platform}; refund POSTs held {SLOW_POST_SECONDS:g} s "
          f"against a {CLIENT_TIMEOUT:g} s client timeout, so the workers run with STRIPE_PROCESSING_WINDOW_SECONDS="
          f"{worker_env()['STRIPE_PROCESSING_WINDOW_SECONDS']} (the provider's processing window, configured)")
    print(table(reports))
    for r in reports:
        print()
        print(f"The judge, {r.mode} mode (every worker stopped, settle horizons passed):")
        print(judge_table(r.verdict, details=False))
        for line in detail_lines(r.verdict, controls_too=args.details):
            print(line)
        if r.unattributed_timeouts:
            print(f"  [{r.mode}] timeouts no kill explains: {dict(Counter(r.unattributed_timeouts))}")
        print(f"  [{r.mode}] worker exit codes at the final stop: {r.stop_exit_codes} "
              "(0 is a normal stop)")
        for task_id, outcome in sorted(r.held.items()):
            print(f"  [{r.mode}] refund POST held beyond the window: {task_id}: {outcome}")
    if keep:
        print(f"data kept in {root}")
    ok = all(r.passed for r in reports)
    for r in reports:
        for reason in r.why_not():
            print(f"  [{r.mode}] fails: {reason}")
    print("exactly once: " + ("yes" if ok else "NO"))
    return 0 if ok else 1


if __name__ == "__main__":
    run_main(lambda: asyncio.run(main()))
