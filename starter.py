"""Starts agent tasks and shows what they did.

Product commands (need only the installed product and a running worker):

    python starter.py start support T-1001 --text "The shelf arrived broken" --order SU-88421
    python starter.py start --file ticket.json     # the same from a JSON file (see Ticket)
    python starter.py batch tickets.jsonl          # one ticket per line
    python starter.py status ticket-T-1001         # the checkpoint of a task
    python starter.py list                         # tasks waiting for a person
    python starter.py resolve ticket-T-1001 approve --by alice@example.com
    python starter.py redrive ticket-T-1001        # a dead letter, again; done effects not repeated
    python starter.py reconcile                    # the ledger against the provider now

Demo commands (need the dev extra: the local stack, its Stripe edge and demo data):

    python starter.py scenario SU-88421            # run one built-in scenario, show progress and the world
    python starter.py scenario SU-88421 --fault timeout-after-accept   # a fresh task on its own order
    python starter.py compare SU-88421             # our refund tool next to a naive one, same fault
    python starter.py batch 20                     # N generated refund tickets
    python starter.py status ticket-SU-88421       # the checkpoint of a task
    python starter.py list --status awaiting_human # tasks waiting for a person
    python starter.py keygen alice@example.com --out alice.pem   # an approver's key pair
    python starter.py resolve ticket-SU-88421 approve --by alice@example.com --key-file alice.pem
    python starter.py sign ticket-SU-88421 approve --by alice@example.com --key-file alice.pem  # for the Web UI
    python starter.py redrive ticket-SU-88421      # a dead letter, again; done effects not repeated
    python starter.py seed                         # the demo orders and payees at the provider

Teams that start tasks from their own ticket system call `start_ticket(client, settings, Ticket(...))`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import stripe
from pydantic import BaseModel, Field, ValidationError
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from activities.authority import load_key_file, new_key_file, public_key_text, sign
from activities.db import Database
from activities.operations import mark_redriven
from activities.payments import StripeGateway
from activities.records import Records
from activities.world import World
from core.domain import Order
from core.kinds import TaskKind, fact_values
from core.models import (
    Checkpoint,
    DecisionReceipt,
    ReconcileInput,
    ReconcileReport,
    ResolveInput,
    TaskInput,
    TaskResult,
)
from core.names import WORKFLOW_NAME, starting_attributes
from infra import connection
from infra.codec import PayloadKeyError
from infra.exit import run_main
from infra.redact import redact
from infra.settings import Settings, load_settings
from workflows import RECONCILE_WORKFLOW

_TASK_TIMEOUT = timedelta(seconds=3)  # a workflow task lost with a dead worker is retried in 3 s
_LIST_QUERY_TIMEOUT = timedelta(seconds=5)  # a waiting task whose worker is down answers no query
_STATUSES = ["running", "awaiting_human", "completed", "dead_lettered", "cancelled"]


class StarterError(Exception):
    """A problem the operator can fix; printed as one line."""


async def connect(settings: Settings) -> Client:
    try:
        return await connection.connect(settings)
    except ValueError as err:  # a malformed encryption key or connection profile
        raise StarterError(str(err)) from None
    except Exception as err:
        first = str(err).splitlines()[0]
        raise StarterError(f"cannot reach Temporal at {connection.address(settings)}: {first}") from None


def gateway_for(settings: Settings) -> StripeGateway:
    return StripeGateway(settings.stripe_api_key.get_secret_value(), settings.stripe_api_base,
                         settings.stripe_timeout_seconds)


# --- starting a task from a ticket (the product's way in) ---------------------------------------

TicketKind = Literal["support", "refund", "payables"]
# What each kind of ticket becomes: the task kind (its tools and what it may touch, core/kinds.py).
_TASK_KIND = {"support": TaskKind.REFUND_TICKET, "refund": TaskKind.REFUND_REQUEST,
              "payables": TaskKind.SUPPLIER_PAYMENT}

KINDS: dict[str, str] = {
    "support": "a support ticket: look up the order, check the policy, refund the item, tell the seller, "
               "book the return pickup, tell the customer (facts: order_id; item_id optional, binds the items)",
    "refund": "a refund request: look up the order, refund the item, write the confirmation, tell the "
              "customer (facts: order_id; item_id optional, binds the items)",
    "payables": "an approved supplier invoice: look it up, pay it, email the remittance (facts: invoice_id; "
                "payee and recipient optional, bind them)",
}
_REQUIRED_FACTS = {"support": ("order_id",), "refund": ("order_id",), "payables": ("invoice_id",)}


class Ticket(BaseModel):
    """A ticket from your own system, as `start` takes it on the command line or in a JSON file.

    `facts` come from your systems (the order or invoice the ticket is about), never from the
    ticket's text: the agent may only touch them. `order` is for the local stack only: an order to
    create and pay at the local provider before the task starts.
    """

    kind: TicketKind
    ticket_id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    text: str = Field(min_length=1, max_length=20_000)
    facts: dict[str, str] = Field(default_factory=dict)
    order: Order | None = None

    def task_input(self) -> TaskInput:
        """The task: its id comes from the ticket id, so the same ticket always names the same task."""
        facts = {**({"order_id": self.order.order_id} if self.order else {}), **self.facts}
        missing = [f for f in _REQUIRED_FACTS[self.kind] if not facts.get(f)]
        if missing:
            raise StarterError(f"a {self.kind} ticket needs the fact(s) {', '.join(missing)}")
        facts_text = "\n".join(f"{name}: {value}" for name, value in sorted(facts.items()))
        return TaskInput(task_id=f"ticket-{self.ticket_id}", scenario=self.kind, kind=_TASK_KIND[self.kind],
                         brief=f"{self.text}\n\nFacts from our systems:\n{facts_text}", facts=facts)


async def start_ticket(client: Client, settings: Settings, ticket: Ticket) -> WorkflowHandle:
    """Start the task for a ticket, or attach to the one already started for it.

    The task id is `ticket-<ticket_id>`: starting the same ticket again (a retried webhook, a second
    click) attaches to the running task or shows the finished one's result, and never starts a
    second task. The worker's configuration (model backend, ceilings, approvers) applies to it.
    """
    return await start_task(client, settings, ticket.task_input())


def describe_task(settings: Settings, task: TaskInput) -> tuple[str, str]:
    """The task's one-line summary and its details, as the Web UI shows them at the top of its page."""
    order_id, invoice_id, item_id = (task.facts.get(k) for k in ("order_id", "invoice_id", "item_id"))
    amount = None
    try:
        records = Records(Database(settings.database))
        if order_id and (record := records.order(order_id)):
            named = fact_values(task.facts, "item_id")  # one item, or several comma separated
            items = [i for i in record.order.items if not named or i.item_id in named]
            amount = sum(i.amount_cents for i in items) if items else None
        elif invoice_id and (inv := records.invoice(invoice_id)):
            amount = inv.invoice.amount_cents
    except Exception:  # the summary is a courtesy: a starter without the ledger database still starts tasks
        amount = None
    parts = [task.scenario, task.task_id]
    parts += [f"order {order_id}"] if order_id else []
    parts += [f"item {item_id}"] if item_id else []
    parts += [f"invoice {invoice_id}"] if invoice_id else []
    parts += [f"${amount / 100:,.2f}"] if amount is not None else []
    details = "\n".join([f"**{task.scenario}** task `{task.task_id}`", "",
                         *(f"- {name}: `{value}`" for name, value in sorted(task.facts.items())),
                         *([f"- amount: ${amount / 100:,.2f}"] if amount is not None else []),
                         "", "Current details (User Metadata) show what the task is doing and what it waits for."])
    return " · ".join(parts), details


async def start_task(client: Client, settings: Settings, task: TaskInput) -> WorkflowHandle:
    """Start the task, or attach to it when a run with this id is going or has completed.

    A completed task is never run again by a plain start (redrive is explicit); a failed or
    terminated one may be, and its intent keys make the done steps come back already_performed.
    Approvers, ceilings and the escalation deadline are the worker's, not the starter's.
    """
    summary, details = describe_task(settings, task)
    try:
        return await client.start_workflow(
            WORKFLOW_NAME, task, id=task.task_id, task_queue=settings.task_queue, result_type=TaskResult,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
            task_timeout=_TASK_TIMEOUT, static_summary=summary, static_details=details,
            search_attributes=starting_attributes(task.scenario),
        )
    except WorkflowAlreadyStartedError:
        return client.get_workflow_handle(task.task_id, result_type=TaskResult)


async def follow(handle: WorkflowHandle, show: bool, until_waiting: bool = False) -> TaskResult | None:
    """Wait for the result, printing each step as its status changes.

    With `until_waiting`, return None as soon as the task waits for a person.
    """
    result = asyncio.ensure_future(handle.result())
    seen: dict[str, str] = {}
    try:
        while not result.done():
            if show or until_waiting:
                try:
                    cp: Checkpoint = await handle.query("checkpoint", result_type=Checkpoint)
                except RPCError:
                    cp = None
                if cp is not None and show:
                    print_progress(cp, seen, hint_ctrl_c=not until_waiting)
                if cp is not None and until_waiting and cp.waiting_for is not None:
                    return None
            await asyncio.wait([result], timeout=0.5)
    finally:
        if not result.done():
            result.cancel()
    return result.result()


def print_progress(cp: Checkpoint, seen: dict[str, str], hint_ctrl_c: bool = True) -> None:
    wait = cp.waiting_for
    if wait is not None and seen.get("#wait") != wait.intent_key:
        seen["#wait"] = wait.intent_key
        ref = " --provider-ref <the provider's id>" if wait.allowed[0] == "mark_performed" else ""
        print(f"  {cp.task_id}  waits for a human: {wait.reason} on {wait.tool} ({wait.detail})\n"
              f"      decide: python starter.py resolve {cp.task_id} {wait.allowed[0]} --by you@example.com"
              f" --key-file you.pem{ref}"
              f"   (allowed: {', '.join(wait.allowed)}; deadline {wait.deadline})"
              + ("\n      Ctrl-C stops watching; the task keeps waiting." if hint_ctrl_c else ""), flush=True)
    for name, step in cp.steps.items():
        line = f"{step.status}{' ' + step.outcome if step.outcome else ''}"
        if seen.get(name) != line:
            seen[name] = line
            print(f"  {cp.task_id}  {name:<22} {line}", flush=True)


def ui_link(settings: Settings, task_id: str) -> str:
    return f"{settings.temporal_ui_url}/namespaces/{connection.namespace(settings)}/workflows/{task_id}"


def world_of(settings: Settings, task: TaskInput) -> dict[str, Any]:
    world = World(Database(settings.database), gateway_for(settings))
    return world.summary(task.task_id, task.facts.get("order_id"), task.facts.get("invoice_id"))


def print_report(settings: Settings, task: TaskInput, result: TaskResult, world: dict[str, Any]) -> None:
    print(f"\n== {task.task_id} ({task.scenario}): {result.state}")
    print(f"   model's answer: {result.final_answer}")
    for name, step in result.checkpoint.steps.items():
        if step.intent_key:
            print(f"   {name}: " + "; ".join(step.trail))
    for refund in world["refunds"]:
        print(f"   provider refund  {refund['id']}  {refund['amount_cents'] / 100:.2f}  key {refund['intent_key']}")
    for payment in world["payments"]:
        print(f"   provider payment {payment['id']}  {payment['amount_cents'] / 100:.2f}  key {payment['intent_key']}")
    for message in world["messages"]:
        print(f"   sent {message['kind']:<15} to {message['recipient']}: {message['body'][:70]}")
    print("   checkpoint:")
    print("   " + result.checkpoint.model_dump_json(indent=2).replace("\n", "\n   "))
    print(f"   Web UI: {ui_link(settings, task.task_id)}")


async def run_tasks(settings: Settings, tasks: list[TaskInput], as_json: bool) -> list[dict[str, Any]]:
    client = await connect(settings)
    handles = [await start_task(client, settings, task) for task in tasks]
    show = not as_json and len(tasks) <= 3
    results = await asyncio.gather(*(follow(h, show) for h in handles))
    summaries = []
    for task, result in zip(tasks, results, strict=True):
        world = world_of(settings, task)
        summaries.append({"task_id": task.task_id, "scenario": task.scenario, "state": result.state,
                          "final_answer": result.final_answer, "world": world,
                          "checkpoint": result.checkpoint.model_dump(mode="json")})
        if not as_json and len(tasks) <= 3:
            print_report(settings, task, result, world)
    return summaries


def read_ticket_file(path: Path) -> list[Ticket]:
    """Tickets from a JSON file (one object) or a JSONL file (one object a line)."""
    try:
        text = path.read_text()
    except OSError as err:
        raise StarterError(f"cannot read {path}: {err.strerror}") from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    chunks = [(1, text)] if path.suffix == ".json" else lines
    tickets = []
    for n, chunk in chunks:
        try:
            tickets.append(Ticket.model_validate_json(chunk))
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "the ticket"
            raise StarterError(f"{path}:{n}: {where}: {first['msg']}") from None
    if not tickets:
        raise StarterError(f"{path} holds no ticket")
    return tickets


def prepare_orders(settings: Settings, tickets: list[Ticket]) -> None:
    """Create and pay the tickets' `order`s at the local provider (the local stack only)."""
    orders = [t.order for t in tickets if t.order is not None]
    if not orders:
        return
    seed_order = _devstack("devstack.seed", "an `order` in a ticket").seed_order
    db = Database(settings.database)
    db.create()
    try:
        for order in orders:
            seed_order(Records(db), gateway_for(settings), order)
    except stripe.StripeError as err:
        raise StarterError(f"cannot reach the payment provider at {settings.stripe_api_base}: "
                           f"{type(err).__name__}") from None


async def cmd_start(args: argparse.Namespace, settings: Settings) -> int:
    if args.file:
        tickets = read_ticket_file(args.file)
        if len(tickets) != 1:
            raise StarterError(f"{args.file} holds {len(tickets)} tickets; `batch {args.file}` starts them all")
        ticket = tickets[0]
    else:
        if not (args.kind and args.ticket_id and args.text):
            raise StarterError("start needs a kind, a ticket id and --text (or --file ticket.json)")
        facts = {k: v for k, v in (("order_id", args.order), ("item_id", args.item),
                                   ("invoice_id", args.invoice)) if v}
        try:
            ticket = Ticket(kind=args.kind, ticket_id=args.ticket_id, text=args.text, facts=facts)
        except ValidationError as err:
            first = err.errors()[0]
            raise StarterError(f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None
    prepare_orders(settings, [ticket])
    task = ticket.task_input()
    client = await connect(settings)
    handle = await start_ticket(client, settings, ticket)
    print(f"{task.task_id}: started or attached (run {handle.result_run_id or handle.run_id or 'current'}); "
          f"Web UI {ui_link(settings, task.task_id)}",
          flush=True)
    if args.no_wait:
        return 0
    result = await follow(handle, show=not args.json, until_waiting=args.until_waiting)
    if result is None:
        print(f"{task.task_id} waits for a person; `python starter.py list` shows why")
        return 0
    world = world_of(settings, task)
    if args.json:
        print(json.dumps({"task_id": task.task_id, "state": result.state, "final_answer": result.final_answer,
                          "world": world, "checkpoint": result.checkpoint.model_dump(mode="json")}, indent=2))
    else:
        print_report(settings, task, result, world)
    return 0


async def cmd_batch(args: argparse.Namespace, settings: Settings) -> int:
    if args.source.isdigit():
        tasks = _devstack("devstack.demo_commands", "`batch N` (generated tickets)").generated_tickets(
            settings, int(args.source))
    else:
        tickets = read_ticket_file(Path(args.source))
        prepare_orders(settings, tickets)
        tasks = [t.task_input() for t in tickets]
    started = time.monotonic()
    summaries = await run_tasks(settings, tasks, args.json)
    elapsed = time.monotonic() - started
    refunds = sum(len(s["world"]["refunds"]) for s in summaries)
    report = {"tasks": len(tasks), "completed": sum(s["state"] == "completed" for s in summaries),
              "provider_refunds": refunds, "seconds": round(elapsed, 2)}
    print(json.dumps({**report, "tasks_detail": summaries} if args.json else report, indent=2))
    return 0


# --- operating tasks ---------------------------------------------------------------------------

async def checkpoint_of(client: Client, task_id: str) -> Checkpoint:
    try:
        return await client.get_workflow_handle(task_id).query("checkpoint", result_type=Checkpoint)
    except RPCError as err:
        raise StarterError(f"no task {task_id}: {err.message}") from None


async def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    client = await connect(settings)
    print((await checkpoint_of(client, args.task_id)).model_dump_json(indent=2))
    return 0


async def signed_decision(args: argparse.Namespace, client: Client | None) -> ResolveInput:
    """The decision the options describe, for the call the task waits for, signed with --key-file."""
    try:
        key = load_key_file(args.key_file)
    except ValueError as err:
        raise StarterError(str(err)) from None
    intent_key = args.key
    if intent_key is None:
        if client is None:
            raise StarterError("--key is needed when Temporal is not asked which call the task waits for")
        cp = await checkpoint_of(client, args.task_id)
        if cp.waiting_for is None:
            raise StarterError(f"{args.task_id} is {cp.state}, not waiting for a decision")
        intent_key = cp.waiting_for.intent_key
    if args.decision == "mark_performed" and not args.provider_ref:
        raise StarterError("mark_performed needs --provider-ref (the provider's id of the effect, e.g. re_...)")
    try:
        decision = ResolveInput(task_id=args.task_id, intent_key=intent_key, decision=args.decision,
                                decided_by=args.by, note=args.note, provider_ref=args.provider_ref)
    except ValidationError as err:
        raise StarterError(f"bad decision: {err.errors()[0]['msg']}") from None
    return sign(decision, key, timedelta(minutes=args.valid_for))


async def cmd_resolve(args: argparse.Namespace, settings: Settings) -> int:
    """Sign a decision on the call a task waits for and send it through the `decide` Update."""
    client = await connect(settings)
    decision = await signed_decision(args, client)
    handle = client.get_workflow_handle(args.task_id)
    try:
        receipt = await handle.execute_update("decide", decision, result_type=DecisionReceipt)
    except WorkflowUpdateFailedError as err:
        raise StarterError(f"decision not applied: {getattr(err.cause, 'message', err.cause)}") from None
    except RPCError as err:
        raise StarterError(f"no task {args.task_id}: {err.message}") from None
    print(f"{args.task_id}: {receipt.decision} on {receipt.intent_key} by {receipt.decided_by}; now {receipt.state}")
    return 0


async def cmd_sign(args: argparse.Namespace, settings: Settings) -> int:
    """Print a signed decision as JSON: paste it into the Web UI's Send a Signal form (`resolve`)."""
    client = None if args.key else await connect(settings)
    print((await signed_decision(args, client)).model_dump_json(indent=2))
    return 0


async def cmd_keygen(args: argparse.Namespace, settings: Settings) -> int:
    """A new approver key pair: the private key to a file, the worker's APPROVERS entry to stdout."""
    try:
        key = new_key_file(args.out)
    except FileExistsError:
        raise StarterError(f"{args.out} exists; keys are never overwritten") from None
    except OSError as err:
        raise StarterError(f"cannot write {args.out}: {err.strerror}") from None
    print(f"private key: {args.out} (keep it to yourself; it signs your decisions)")
    print(f"add to the worker's APPROVERS (comma-separated): {args.name}={public_key_text(key)}")
    return 0


async def redrive(client: Client, settings: Settings, task_id: str, force: bool = False,
                  escalation_timeout_seconds: int | None = None) -> tuple[WorkflowHandle, TaskInput, str]:
    """Start a dead-lettered (or failed, cancelled) task again with its original input.

    Done effects come back already_performed from the ledger: the intent keys are the same.
    `escalation_timeout_seconds` replaces how long the new run waits for a person when it escalates.
    """
    handle = client.get_workflow_handle(task_id, result_type=TaskResult)
    try:
        description = await handle.describe()
        history = await handle.fetch_history()
    except RPCError as err:
        raise StarterError(f"no task {task_id}: {err.message}") from None
    if description.status == WorkflowExecutionStatus.RUNNING:
        raise StarterError(f"{task_id} is still running; resolve it instead")
    state = (await handle.result()).state if description.status == WorkflowExecutionStatus.COMPLETED else \
        description.status.name.lower()
    if state == "completed" and not force:
        raise StarterError(f"{task_id} completed; --force to run it again anyway")
    started = history.events[0].workflow_execution_started_event_attributes
    [task] = await client.data_converter.decode(started.input.payloads, [TaskInput])
    update: dict[str, Any] = {"redrive_of": description.run_id}
    if escalation_timeout_seconds is not None:
        update["escalation_timeout_seconds"] = escalation_timeout_seconds
    task = task.model_copy(update=update)
    summary, details = describe_task(settings, task)
    new = await client.start_workflow(
        WORKFLOW_NAME, task, id=task.task_id, task_queue=settings.task_queue, result_type=TaskResult,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE, task_timeout=_TASK_TIMEOUT,
        static_summary=f"{summary} · redrive", static_details=details,
        search_attributes=starting_attributes(task.scenario))
    mark_redriven(Database(settings.database), task.task_id)
    return new, task, state


async def cmd_redrive(args: argparse.Namespace, settings: Settings) -> int:
    client = await connect(settings)
    handle, task, was = await redrive(client, settings, args.task_id, args.force, args.escalation_timeout)
    print(f"redriving {task.task_id} (was {was}, run {task.redrive_of}) as run {handle.result_run_id}; "
          f"waits {task.escalation_timeout_seconds} s for a person if it escalates", flush=True)
    if args.no_wait:
        return 0
    result = await follow(handle, show=True)
    print_report(settings, task, result, world_of(settings, task))
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
            cp = await client.get_workflow_handle(task_id).query("checkpoint", result_type=Checkpoint,
                                                                 rpc_timeout=_LIST_QUERY_TIMEOUT)
        except (RPCError, WorkflowQueryFailedError) as err:
            return f"(its checkpoint did not answer: {str(err).splitlines()[0] if str(err) else type(err).__name__})"
        wait = cp.waiting_for
        return f"{wait.reason} on {wait.tool}, key {wait.intent_key}" if wait else ""

    for task_id, text in zip(ids, await asyncio.gather(*(detail(i) for i in ids)), strict=True):
        print(f"{task_id:<32} {args.status:<15} {text}")
    if not ids:
        print(f"no task is {args.status.replace('_', ' ')}")
    return 0


async def cmd_reconcile(args: argparse.Namespace, settings: Settings) -> int:
    """Compare the ledger with the provider now (the schedule does it every few minutes)."""
    client = await connect(settings)
    report = await client.execute_workflow(
        RECONCILE_WORKFLOW, ReconcileInput(stale_after_seconds=args.stale_after), id="reconcile-ledger-now",
        task_queue=settings.task_queue, result_type=ReconcileReport,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING)
    print(f"checked {report.checked_ledger_rows} ledger rows and {report.checked_provider_effects} provider "
          f"effects: {len(report.findings)} findings")
    for finding in report.findings:
        print(f"  {finding.kind:<31} {finding.intent_key or '-':<50} {' '.join(finding.provider_refs)}  "
              f"{finding.detail}")
    return 1 if report.findings else 0


# --- demo commands: devstack/demo_commands.py, on the local stack (the dev extra) -----------------

def _devstack(module: str, what: str) -> Any:
    """A devstack module, imported only by the demo commands: the product runs without it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise StarterError(f"{what} needs the local stack (the dev extra: pip install -e '.[dev]')") from None


def _demo(name: str) -> Any:
    """A demo command of devstack/demo_commands.py, imported when it runs."""
    async def run(args: argparse.Namespace, settings: Settings) -> int:
        commands = _devstack("devstack.demo_commands", f"`{args.command}`")
        return await getattr(commands, name)(args, settings)
    return run


def add_fault_options(p: argparse.ArgumentParser, default_fault: str | None = None) -> None:
    p.add_argument("--fault", default=default_fault, metavar="FAULT",
                   help="inject this fault on the first money request at the local Stripe edge: "
                        "timeout-after-accept, error-after-commit, drop-after-commit, error-before-commit, "
                        "drop-before-commit, conflict-before-commit, unverifiable")
    p.add_argument("--edge-mode", choices=["dedupe", "passthrough"], default="dedupe",
                   help="the edge honours idempotency keys as Stripe does (dedupe) or ignores them")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Start agent tasks and show what they did.",
                                epilog="Configuration comes from the environment; see the README's Configuration.")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("start", help="start a task from a ticket of your own (or attach to it)")
    t.add_argument("kind", nargs="?", choices=sorted(KINDS), help="; ".join(f"{k}: {v}" for k, v in KINDS.items()))
    t.add_argument("ticket_id", nargs="?", help="your ticket's id; the task is ticket-<id>")
    t.add_argument("--text", help="the ticket's text, as the customer or colleague wrote it")
    t.add_argument("--order", help="fact: the order the ticket is about")
    t.add_argument("--item", help="fact: the item of the order the agent may refund (several: comma separated)")
    t.add_argument("--invoice", help="fact: the invoice (payables)")
    t.add_argument("--file", type=Path, help="a JSON ticket: kind, ticket_id, text, facts (and order, locally)")
    t.add_argument("--no-wait", action="store_true", help="start it and return")
    t.add_argument("--until-waiting", action="store_true",
                   help="watch it until it completes or waits for a person, then return")
    t.add_argument("--json", action="store_true")
    t.set_defaults(run=cmd_start)
    b = sub.add_parser("batch", help="start tickets from a JSONL file, or N generated demo tickets")
    b.add_argument("source", metavar="FILE|N", help="a .jsonl file of tickets (one a line), or a number")
    b.add_argument("--json", action="store_true")
    b.set_defaults(run=cmd_batch)
    st = sub.add_parser("status", help="print a task's checkpoint")
    st.add_argument("task_id")
    st.set_defaults(run=cmd_status)
    for name, run, text in (("resolve", cmd_resolve, "sign a decision on the call a task waits for and send it"),
                            ("sign", cmd_sign, "print a signed decision, for the Web UI's signal form")):
        r = sub.add_parser(name, help=text)
        r.add_argument("task_id")
        r.add_argument("decision", choices=["approve", "reject", "mark_performed", "mark_not_performed", "abort"])
        r.add_argument("--by", required=True, help="the approver's name, as in the worker's APPROVERS")
        r.add_argument("--key-file", required=True, type=Path, help="the approver's private key (starter.py keygen)")
        r.add_argument("--note", default="")
        r.add_argument("--key", help="intent key of the call (default: the one the task waits for)")
        r.add_argument("--provider-ref", help="the provider's id of the effect, for mark_performed")
        r.add_argument("--valid-for", type=float, default=60, metavar="MINUTES", help="the signature's lifetime")
        r.set_defaults(run=run)
    kg = sub.add_parser("keygen", help="create an approver's key pair")
    kg.add_argument("name", help="the approver's name, e.g. alice@example.com")
    kg.add_argument("--out", required=True, type=Path, help="file for the private key (created, mode 600)")
    kg.set_defaults(run=cmd_keygen)
    rd = sub.add_parser("redrive", help="start a dead-lettered task again; done effects are not repeated")
    rd.add_argument("task_id")
    rd.add_argument("--force", action="store_true", help="also redrive a completed task")
    rd.add_argument("--escalation-timeout", type=int, metavar="SECONDS",
                    help="how long the new run waits for a person (default: as the first run)")
    rd.add_argument("--no-wait", action="store_true")
    rd.set_defaults(run=cmd_redrive)
    ls = sub.add_parser("list", help="this task queue's tasks by status (AgentStatus search attribute)")
    ls.add_argument("--status", default="awaiting_human", choices=_STATUSES)
    ls.set_defaults(run=cmd_list)
    rc = sub.add_parser("reconcile", help="compare the ledger with the provider now; exit 1 on findings")
    rc.add_argument("--stale-after", type=int, default=900, metavar="SECONDS")
    rc.set_defaults(run=cmd_reconcile)
    s = sub.add_parser("scenario", help="demo: run a built-in scenario (SU-88421, refund-8841, INV-9)")
    s.add_argument("name", metavar="NAME", help="SU-88421, refund-8841 or INV-9")
    s.add_argument("--repeat-effects", type=int, default=0, metavar="N",
                   help="the scripted model asks again N times for each money effect already done")
    s.add_argument("--task-id", help="run as a new task with this id, on its own order")
    s.add_argument("--json", action="store_true")
    add_fault_options(s)
    s.set_defaults(run=_demo("cmd_scenario"))
    c = sub.add_parser("compare", help="demo: a refund scenario through our tool and a naive one, same fault")
    c.add_argument("name", metavar="NAME", help="SU-88421 or refund-8841")
    add_fault_options(c, default_fault="timeout-after-accept")
    c.set_defaults(run=_demo("cmd_compare"))
    sd = sub.add_parser("seed", help="demo: create the demo orders and payees at the local provider")
    sd.add_argument("--batch", type=int, default=0)
    sd.set_defaults(run=_demo("cmd_seed"))
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    settings = load_settings()
    try:
        return asyncio.run(args.run(args, settings))
    except (StarterError, PayloadKeyError) as err:  # may quote a URL: STRIPE_API_BASE, a provider's error
        print(f"starter: {redact(str(err))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `| head` closed the pipe: the rest of the output has no reader
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("starter: stopped watching; started tasks go on in Temporal", file=sys.stderr)
        return 130


if __name__ == "__main__":
    import starter  # the module the demo commands import, so that one StarterError class is caught

    run_main(starter.main)
