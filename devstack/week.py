"""A Sundry week: 4,200 generated refund tickets of a realistic mix, started at once, timed.

    python -m devstack.week [--tickets 4200] [--seed 1] [--fault-rate 0.03] [--encrypted] [--json]
                            [--logs DIR] [--server-config KEY=VALUE ...]

On a fresh local stack (Temporal dev server, localstripe behind the Stripe edge in dedupe mode) with
one worker, `python worker.py` in a process of its own, as a deployment runs it (this process only
starts the tickets and reads the world):

- plain: a one-item order, refunded in full (about 76%);
- multi-item: a three-item order, one ticket refunding two of its items (10%);
- second ticket: a recent plain ticket's item asked for again under another task (8%): answered
  with the earlier refund, or handed to a person while that refund is still in flight;
- over the ceiling: a one-item order above the approval ceiling, which waits for a human (6%);
- provider faults on every kind: `--fault-rate` of refund POSTs each time out after the provider
  accepted, fail before it commits, or fail after it committed.

The clock runs from the first start until every task has completed, dead-lettered or is waiting
for a human. Then the world is read: the provider's refunds per order against its prices, refunds
per intent key, and the ledger's rows. Exit 1 when anything was paid twice or a task was lost.

Beside it, unless `--no-bare`: bare Temporal's week on the same server, as many tasks of seven no-op
activities each (a plain ticket's model turns and tool calls, as `devstack.load`'s bare side) on
`python -m devstack.bare_worker` (every worker option of ours), started the same way, timed from the
first start to the last completion. Both clocks read settled tasks from a visibility count every
2 s, so each figure may be up to 2 s late.

Honesty, read from every task's history of both sides afterwards (devstack/attempts.py): attempts the
server timed out while the worker ran them (no worker is killed here, so every timeout is of a live
attempt; each worker's log file counts them too), activity retries by cause, and escalations to a
person by cause and by ticket kind. Exit 1 also when a live attempt was timed out, or a ticket other
than an over-the-ceiling one or a second ticket (which may race its earlier refund by design) was
handed to a person.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
from temporalio.client import Client, WorkflowHandle

from activities.db import Database
from activities.heartbeats import FIRST_BEAT
from activities.payments import StripeGateway
from activities.records import Records
from activities.world import World
from client import start_task
from core import policies
from core.domain import Item, Order
from core.kinds import TaskKind
from core.models import TaskInput
from core.names import STATUS_ATTR
from devstack import attempts, targets
from devstack.bench_bare import BareTaskWorkflow
from devstack.edge_control import EdgeControl
from devstack.load import ENCRYPTED_HELP, bare_client, cpu_seconds, host_ticks, payloads_described, stolen_share
from devstack.polling import poll_until
from devstack.seed import seed_order
from devstack.stack import STRIPE_API_KEY, Stack, add_server_config_option
from infra.codec import new_key
from infra.connection import converter_for
from infra.exit import run_main
from infra.settings import Settings
from infra.telemetry import GC_PAUSE_SAID

QUEUE, BARE_QUEUE = "week", "week-bare"
BARE_STEPS = 7  # a plain ticket: four model turns, three tool calls
# Ticket kinds that may wait for a person without anything being wrong.
MAY_ESCALATE = ("over-ceiling", "second")
# The provider terms of this run: a fault's retry waits out the request's settle horizon
# (send-by + timeout + window), so they are kept short, as chaos does.
CLIENT_TIMEOUT, WINDOW = 2.0, 1.0
FAULTS = ("timeout_after_accept", "error_before_commit", "error_after_commit")


@dataclass(frozen=True)
class Ticket:
    task: TaskInput
    kind: str
    order_id: str


@dataclass
class Plan:
    orders: list[Order] = field(default_factory=list)
    tickets: list[Ticket] = field(default_factory=list)


def _order(n: int, prices: list[int]) -> Order:
    return Order(order_id=f"W-{n:05d}", customer_name=f"Customer {n}", customer_email=f"week{n}@example.com",
                 seller="Sundry", seller_email="seller@sundry.example",
                 items=[Item(item_id=f"item-{i}", description=f"Item {i}", amount_cents=cents)
                        for i, cents in enumerate(prices, start=1)])


def _ticket(order: Order, kind: str, number: int, items: list[str]) -> Ticket:
    facts = {"order_id": order.order_id, **({"item_id": items[0]} if len(items) == 1 else {})}
    options: dict[str, Any] = {"item_id": items[0], **({"extra_refund_items": items[1:]} if items[1:] else {})}
    return Ticket(TaskInput(
        task_id=f"week-{number:05d}-{order.order_id}", scenario=f"week-{kind}", kind=TaskKind.REFUND_TICKET,
        brief=(f"Support ticket for order {order.order_id}: {', '.join(items)} arrived damaged; refund "
               f"{'them' if len(items) > 1 else 'it'} and tell the customer.\n\norder_id: {order.order_id}"),
        facts=facts, model_options=options), kind, order.order_id)


def plan(count: int, rng: random.Random, ceiling_cents: int) -> Plan:
    week = Plan()
    plain: list[Order] = []
    while len(week.tickets) < count:
        draw, number = rng.random(), len(week.tickets) + 1
        if draw < 0.08 and plain:
            order = rng.choice(plain[-30:])  # recent: often still running, so the two race
            week.tickets.append(_ticket(order, "second", number, ["item-1"]))
            continue
        n = len(week.orders) + 1
        if draw < 0.18:
            order = _order(n, [rng.randrange(500, 4000) for _ in range(3)])
            week.tickets.append(_ticket(order, "multi-item", number, ["item-1", "item-2"]))
        elif draw < 0.24:
            order = _order(n, [ceiling_cents + rng.randrange(100, 20000)])
            week.tickets.append(_ticket(order, "over-ceiling", number, ["item-1"]))
        else:
            order = _order(n, [rng.randrange(500, 9000)])
            plain.append(order)
            week.tickets.append(_ticket(order, "plain", number, ["item-1"]))
        week.orders.append(order)
    return week


def fault_rules(rate: float) -> list[dict[str, Any]]:
    delays = {"timeout_after_accept": CLIENT_TIMEOUT + 1.0}
    return [{"fault": fault, "method": "POST", "path": "/v1/refunds", "probability": rate,
             "delay_seconds": delays.get(fault, 0.0)} for fault in FAULTS]


def _seed(settings: Settings, stack: Stack, orders: list[Order]) -> None:
    """One after another: each order is seeded under the database's write lock anyway."""
    records = Records(Database(settings.database))
    gateway = StripeGateway(STRIPE_API_KEY, stack.stripe_url, 10.0)
    for order in orders:
        seed_order(records, gateway, order)


def judge(world: World, week: Plan, states: dict[str, str]) -> dict[str, Any]:
    """What happened, read from the provider and the ledger."""
    prices = {(o.order_id, i.item_id): i.amount_cents for o in week.orders for i in o.items}
    paid = {o.order_id: o.paid_cents for o in week.orders}
    per_item: Counter = Counter()
    per_key: Counter = Counter()
    per_order: Counter = Counter()
    refunds = 0
    for order in week.orders:
        for refund in world.refunds(order.order_id):
            refunds += 1
            per_item[(order.order_id, refund["item_id"])] += refund["amount_cents"]
            per_order[order.order_id] += refund["amount_cents"]
            per_key[refund["intent_key"]] += 1
    rows = [e for e in world.effects() if e["tool"] == "issue_refund"]
    return {
        "provider refunds": refunds,
        "items paid twice (refunds above the price)": sum(v > prices[k] for k, v in per_item.items()),
        "orders refunded beyond what was paid": sum(v > paid[k] for k, v in per_order.items()),
        "provider refunds per intent key above one": sum(v - 1 for v in per_key.values() if v > 1),
        "ledger rows by status": dict(Counter(r["status"] for r in rows)),
        "lost (not completed, dead-lettered or waiting)": sum(
            1 for t in week.tickets if states.get(t.task.task_id) not in SETTLED),
    }


class ProcessCpu:
    """CPU seconds each process of one side spent between `start` and `stop`: the Temporal server,
    localstripe, the side's worker and what it started (the liveness keeper), and this process (the
    starts and the visibility counts). Read before the worker stops, while its children are alive."""

    def __init__(self, stack: Stack, worker_pid: int | None) -> None:
        self._pids = {"Temporal server": stack.temporal.pid if stack.temporal else None,
                      "localstripe": stack.localstripe.pid if stack.localstripe else None,
                      "worker": worker_pid, "this process (starts, counts)": os.getpid()}
        self._before: dict[str, float] = {}

    def _read(self) -> dict[str, float]:
        seconds = {name: cpu_seconds(pid) for name, pid in self._pids.items()}
        worker = self._pids["worker"]
        if worker is not None:
            try:
                seconds["worker's liveness keeper"] = sum(
                    cpu_seconds(child.pid) for child in psutil.Process(worker).children(recursive=True))
            except psutil.NoSuchProcess:
                seconds["worker's liveness keeper"] = 0.0
        return seconds

    def start(self) -> None:
        self._before = self._read()

    def stop(self) -> dict[str, float]:
        after = self._read()
        return {name: after[name] - self._before.get(name, 0.0) for name in after}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="week-") as tmp, \
            Stack.for_tests(Path(tmp), server_config=dict(args.server_config)) as stack:
        key = new_key() if args.encrypted else None
        settings = Settings(temporal_address=stack.address, task_queue=QUEUE, stripe_api_base=stack.stripe_url,
                            stripe_api_key=STRIPE_API_KEY, agent_db_path=stack.agent_db, payload_encryption_key=key,
                            stripe_timeout_seconds=CLIENT_TIMEOUT, stripe_processing_window_seconds=WINDOW)
        # The key is the flag's alone (empty is none), whatever this process's environment holds.
        worker_env = {"TASK_QUEUE": QUEUE, "STRIPE_TIMEOUT_SECONDS": str(CLIENT_TIMEOUT),
                      "STRIPE_PROCESSING_WINDOW_SECONDS": str(WINDOW), "RECONCILE_EVERY_MINUTES": "0",
                      "PAYLOAD_ENCRYPTION_KEY": key or ""}
        week = plan(args.tickets, rng, settings.approval_ceiling_cents)
        Database(settings.database).create()
        started = time.perf_counter()
        await asyncio.to_thread(_seed, settings, stack, week.orders)
        print(f"seeded {len(week.orders)} paid orders in {time.perf_counter() - started:.1f}s", flush=True)
        edge = EdgeControl(stack.stripe_url)
        edge.configure("dedupe", fault_rules(args.fault_rate))
        # The tickets go through the product's converter (encrypted with --encrypted, as the deployment runs
        # them). Bare Temporal's tasks are started through the SDK's, on the same connection, and its worker
        # process reads them with the product's converter without a key (devstack/bare_worker.py).
        client = await Client.connect(stack.address, data_converter=converter_for(settings))
        bare_starter = bare_client(client)
        sem = asyncio.Semaphore(50)

        async def start(ticket: Ticket) -> WorkflowHandle:
            async with sem:
                return await start_task(client, settings, ticket.task)

        worker = stack.start_worker(stack.log_file("worker"), worker_env)
        try:
            meter = ProcessCpu(stack, worker.pid)
            meter.start()
            started, host = time.perf_counter(), host_ticks()
            await asyncio.gather(*(start(t) for t in week.tickets))
            results = await settle(client, len(week.tickets), started, args.deadline)
            elapsed = time.perf_counter() - started
            stolen = {"harness": stolen_share(host, host_ticks())}
            cpu = {"harness": meter.stop()}
        finally:
            worker.stop()
        first = week.tickets[0].task.task_id
        stored = {"ticket's input (the client's)": await stored_encoding(client, first, "workflow_execution_started"),
                  "ticket's first step (the worker's)": await stored_encoding(client, first, "activity_task_scheduled")}
        faults = {k.removeprefix("fault:"): v for k, v in edge.stats().items()
                  if k.startswith("fault:") and k.count(":") == 1}
        edge.configure("dedupe", [])
        world = judge(World(Database(settings.database), StripeGateway(STRIPE_API_KEY, stack.stripe_url, 10.0)),
                      week, results)
        host = host_ticks()
        bare_env = {**worker_env, "PAYLOAD_ENCRYPTION_KEY": ""}
        bare_seconds = None if args.no_bare else await bare_week(bare_starter, stack, bare_env, len(week.tickets),
                                                         args.deadline, cpu)
        if bare_seconds is not None:
            stolen["bare"] = stolen_share(host, host_ticks())
            stored["bare task's first step"] = await stored_encoding(bare_starter, "week-bare-00000",
                                                                     "activity_task_scheduled")
        by_kind = {kind: await attempts.read(client, [t.task.task_id for t in week.tickets if t.kind == kind])
                   for kind in dict.fromkeys(t.kind for t in week.tickets)}
        honesty = {"harness": sum(by_kind.values(), attempts.Attempts()),
                   **({} if args.no_bare else {"bare": await attempts.read(
                       bare_starter, [f"week-bare-{n:05d}" for n in range(len(week.tickets))])})}
        logs = {"harness": stack.log_file("worker"), "bare": stack.log_file("bare-worker")}
        seen = {side: attempts.seen_in_log(logs[side]) for side in honesty}
        if args.logs:
            args.logs.mkdir(parents=True, exist_ok=True)
            for path in logs.values():
                if path.exists():
                    shutil.copy(path, args.logs / path.name)
        for side, tally in honesty.items():
            tally.worker_saw = seen[side].count
    kinds = Counter(t.kind for t in week.tickets)
    return {"tickets": len(week.tickets), "orders": len(week.orders), "seconds": elapsed,
            "tasks_per_s": len(week.tickets) / elapsed, "kinds": dict(kinds), "faults": faults,
            "states": dict(Counter(results.get(t.task.task_id, "lost") for t in week.tickets)),
            "states_by_kind": {k: dict(Counter(results.get(t.task.task_id, "lost")
                                               for t in week.tickets if t.kind == k))
                               for k in kinds},
            "world": world, "bare_seconds": bare_seconds, "server_config": stack.server_config,
            "encrypted": args.encrypted, "compressed": args.encrypted and settings.payload_compression,
            "stored_encodings": stored,
            "stolen": stolen,
            "cpu": cpu,
            "honesty": {side: tally.as_dict() for side, tally in honesty.items()},
            "escalations_by_kind": {kind: dict(tally.escalations) for kind, tally in by_kind.items()
                                    if tally.escalations},
            "notices": [line for side in seen.values() for line in side.lines],
            "gc_pauses": {side: notices.gc_pauses for side, notices in seen.items()}}


async def stored_encoding(client: Client, workflow_id: str, event: str) -> str:
    """The encoding of the payload the server holds for a run's first `event` (workflow_execution_started,
    activity_task_scheduled): what the client or the worker that wrote it encoded ("binary/encrypted" under
    a key)."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    attributes = next(getattr(e, f"{event}_event_attributes") for e in history.events
                      if e.HasField(f"{event}_event_attributes"))
    return attributes.input.payloads[0].metadata["encoding"].decode()


async def bare_week(client: Client, stack: Stack, worker_env: dict[str, str], count: int, deadline: float,
                    cpu: dict[str, dict[str, float]]) -> float:
    """Seconds for `count` bare tasks of BARE_STEPS no-op activities, started 50 at a time as the
    tickets are, on a bare worker process with our worker options; NaN when they did not all complete.
    The CPU each process spent meanwhile goes to `cpu["bare"]`."""
    sem = asyncio.Semaphore(50)

    async def start(n: int) -> None:
        async with sem:
            await client.start_workflow(BareTaskWorkflow.run, BARE_STEPS, id=f"week-bare-{n:05d}",
                                        task_queue=BARE_QUEUE, task_timeout=timedelta(seconds=3))

    async def all_completed() -> bool:
        done = f'TaskQueue = "{BARE_QUEUE}" AND ExecutionStatus = "Completed"'
        return (await client.count_workflows(done)).count >= count

    worker = stack.start_worker(stack.log_file("bare-worker"), {**worker_env, "TASK_QUEUE": BARE_QUEUE},
                                module="devstack.bare_worker")
    meter = ProcessCpu(stack, worker.pid)
    try:
        meter.start()
        started = time.perf_counter()
        await asyncio.gather(*(start(n) for n in range(count)))
        try:  # as settle(): a visibility count every 2 s
            await poll_until(all_completed, f"{count} bare tasks", every=2.0,
                             timeout=deadline - (time.perf_counter() - started))
        except TimeoutError:
            return math.nan
        return time.perf_counter() - started
    finally:
        cpu["bare"] = meter.stop()
        worker.stop()


SETTLED = ("completed", "dead_lettered", "cancelled", "awaiting_human")


async def settle(client: Client, total: int, started: float, deadline: float) -> dict[str, str]:
    """Each task's end state, from the visibility store: its `AgentStatus` once that is completed,
    dead_lettered, cancelled or awaiting_human (a task waiting for a person never returns a result,
    and thousands of open result() calls would exceed the server's concurrent long polls). Counted
    every 2 s until all are settled; a task not settled `deadline` seconds after the start is lost."""
    states = ", ".join(f'"{state}"' for state in SETTLED)
    done_query = f'TaskQueue = "{QUEUE}" AND AgentStatus IN ({states})'
    last_report = time.perf_counter()
    while time.perf_counter() - started < deadline:
        settled = (await client.count_workflows(done_query)).count
        if settled >= total:
            break
        if time.perf_counter() - last_report > 15:
            last_report = time.perf_counter()
            print(f"  {settled}/{total} settled after {last_report - started:.0f} s", flush=True)
        await asyncio.sleep(2.0)  # a visibility count is the cheapest way to see thousands of tasks
    return {w.id: (w.typed_search_attributes.get(STATUS_ATTR) or "running")
            async for w in client.list_workflows(f'TaskQueue = "{QUEUE}"')}


def report(r: dict[str, Any]) -> str:
    lines = [f"A Sundry week: {r['tickets']:,} tickets over {r['orders']:,} orders, one worker, "
             f"refund POST faults {r['faults']}; the tickets' payloads {payloads_described(r)}; "
             f"server config over the stack's: {r.get('server_config') or 'none'}",
             "",
             "| | |", "|---|---|",
             f"| wall time, first start to last settled | {r['seconds']:.0f} s ({r['seconds'] / 60:.1f} min) |",
             f"| throughput | {r['tasks_per_s']:.1f} tasks/s |",
             *bare_rows(r),
             *stolen_rows(r),
             *cpu_rows(r),
             f"| tickets by kind | {', '.join(f'{k} {v}' for k, v in r['kinds'].items())} |",
             f"| end states | {', '.join(f'{k} {v}' for k, v in r['states'].items())} |"]
    lines += [f"| end states, {kind} | {', '.join(f'{k} {v}' for k, v in states.items())} |"
              for kind, states in r["states_by_kind"].items()]
    lines += [f"| {k} | {v} |" for k, v in r["world"].items()]
    sides = {side: attempts.Attempts.from_dict(tally) for side, tally in r["honesty"].items()}
    lines += ["", f"| | {' | '.join('harness' if s == 'harness' else 'bare Temporal' for s in sides)} |",
              f"|---|{'---|' * len(sides)}", *attempts.rows(sides)]
    lines += [f"| escalations, {kind} tickets | {', '.join(f'{k} {v}' for k, v in causes.items())} |"
              for kind, causes in r["escalations_by_kind"].items()]
    # A pause longer than this leaves an attempt started just before it no beat in time (heartbeats.py).
    fatal = policies.TOOL_HEARTBEAT.total_seconds() * (1 - FIRST_BEAT)
    pauses = [r["gc_pauses"][side] for side in sides]
    lines += [f"| garbage collections that held the worker over {GC_PAUSE_SAID} s: count, longest, over {fatal:.1f} s"
              " | " + " | ".join(f"{len(p)}, {max(p, default=0):.2f} s, {sum(x > fatal for x in p)}" for p in pauses)
              + " |"]
    world = r["world"]
    lines += ["", "What the week is read against (devstack/targets.py):", "", *targets.rows(targets.week_targets(
        r["seconds"], r["bare_seconds"], {side: tally.live_timed_out for side, tally in sides.items()},
        sum(sum(causes.values()) for kind, causes in r["escalations_by_kind"].items() if kind not in MAY_ESCALATE),
        {"items": world["items paid twice (refunds above the price)"],
         "orders": world["orders refunded beyond what was paid"],
         "intent keys": world["provider refunds per intent key above one"]},
        world["lost (not completed, dead-lettered or waiting)"]))]
    if r["notices"]:
        lines += ["", "The worker's first lines about attempts timed out while running:", "",
                  *(f"    {line}" for line in r["notices"])]
    return "\n".join(lines)


def dishonest(r: dict[str, Any]) -> list[str]:
    """Attempts timed out while alive and workflow tasks failed (either side), tasks handed to a person that
    had no reason to be."""
    sides = {side: attempts.Attempts.from_dict(tally) for side, tally in r["honesty"].items()}
    return ([f"{side}: {tally.live_timed_out} live attempt(s) timed out" for side, tally in sides.items()
             if tally.live_timed_out]
            + [f"{side}: workflow tasks failed {dict(tally.workflow_task_failures)}" for side, tally in sides.items()
               if tally.workflow_task_failures]
            + [f"{kind} tickets escalated: {causes}" for kind, causes in r["escalations_by_kind"].items()
               if kind not in MAY_ESCALATE])


def bare_rows(r: dict[str, Any]) -> list[str]:
    bare = r["bare_seconds"]
    if bare is None:
        return []
    if math.isnan(bare):  # started, not all completed
        return [f"| bare Temporal: as many tasks of {BARE_STEPS} no-op steps, same server "
                "| not all completed by the deadline |"]
    return [f"| bare Temporal: as many tasks of {BARE_STEPS} no-op steps, same server | {bare:.0f} s, "
            f"{r['tickets'] / bare:.1f} tasks/s |",
            f"| harness / bare | {r['seconds'] / bare:.2f}x the time, {bare / r['seconds']:.0%} of the throughput |"]


def cpu_rows(r: dict[str, Any]) -> list[str]:
    """CPU a ticket (ms) by process, each side over its own tickets: where a week's time went."""
    cpu = r.get("cpu", {})
    if not cpu:
        return []
    sides, tickets = list(cpu), r["tickets"]
    return [f"| CPU a ticket, {name}, {' / '.join(sides)} | "
            + " / ".join(f"{cpu[side].get(name, 0.0) / tickets * 1000:.1f} ms" for side in sides) + " |"
            for name in cpu[sides[0]]]


def stolen_rows(r: dict[str, Any]) -> list[str]:
    stolen = r.get("stolen", {})
    if not stolen:
        return []
    shares = " / ".join(f"{share:.0%}" for share in stolen.values())
    return [f"| host CPU stolen by other guests, {' / '.join(stolen)} | {shares} |"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.week", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tickets", type=int, default=4200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fault-rate", type=float, default=0.03,
                        help="the share of refund POSTs that gets each of the three faults")
    parser.add_argument("--deadline", type=float, default=1800,
                        help="seconds after the first start at which a task not yet settled counts as lost")
    parser.add_argument("--no-bare", action="store_true", help="skip bare Temporal's week beside it")
    parser.add_argument("--encrypted", action="store_true", help=ENCRYPTED_HELP.replace("harness's", "tickets'"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--logs", type=Path, help="keep both workers' log files in this folder")
    add_server_config_option(parser)
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    print()
    print(json.dumps(result, indent=1) if args.json else report(result))
    world = result["world"]
    bad = (world["items paid twice (refunds above the price)"] or world["orders refunded beyond what was paid"]
           or world["provider refunds per intent key above one"]
           or world["lost (not completed, dead-lettered or waiting)"])
    failures = dishonest(result)
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if bad or failures else 0


if __name__ == "__main__":
    run_main(main)
