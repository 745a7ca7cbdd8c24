"""Starts agent tasks and shows what they did.

    python starter.py scenario SU-88421            # run one scenario, show progress and the world
    python starter.py scenario INV-9 --json        # machine-readable summary
    python starter.py scenario SU-88421 --fault timeout-after-accept --edge-mode passthrough
    python starter.py compare SU-88421 --fault timeout-after-accept   # safe tool vs the naive one
    python starter.py batch 20                     # N generated refund tickets
    python starter.py status ticket-SU-88421       # the checkpoint of a task
    python starter.py list --status awaiting_human # tasks waiting for a person
    python starter.py keygen alice@example.com --out alice.pem   # an approver's key pair
    python starter.py resolve ticket-SU-88421 approve --by alice@example.com --key-file alice.pem
    python starter.py sign ticket-SU-88421 approve --by alice@example.com --key-file alice.pem  # for the Web UI
    python starter.py redrive ticket-SU-88421      # a dead letter, again; done effects not repeated
    python starter.py seed                         # orders and payees at the provider
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import stripe
from pydantic import ValidationError
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from activities.authority import load_key_file, new_key_file, public_key_text, sign
from infra import connection
from activities.db import Database
from activities.model import ModelConfigError
from activities.payments import StripeGateway
from activities.operations import mark_redriven
from activities.records import Records
from devstack.seed import seed_order, seed_scenarios
from activities.world import World
from infra.settings import Settings, load_settings
from core.models import (
    Checkpoint,
    DecisionReceipt,
    ReconcileInput,
    ReconcileReport,
    ResolveInput,
    TaskInput,
    TaskResult,
)
from core.names import WORKFLOW_NAME
from devstack.scenarios import REFUND_SCENARIOS, SCENARIOS, batch_ticket
from devstack.edge_control import FAULT_PRESETS, EdgeControl, preset
from devstack.unsafe import naive_refund
from worker import build_worker
from workflows import RECONCILE_WORKFLOW


_TASK_TIMEOUT = timedelta(seconds=3)  # a workflow task lost with a dead worker is retried in 3 s


class StarterError(Exception):
    """A problem the operator can fix; printed as one line."""


async def connect(settings: Settings) -> Client:
    try:
        return await connection.connect(settings)
    except ValueError as err:
        raise StarterError(str(err)) from None
    except Exception as err:
        raise StarterError(f"cannot reach Temporal at {settings.temporal_address}: {str(err).splitlines()[0]}")


def gateway_for(settings: Settings) -> StripeGateway:
    return StripeGateway(settings.stripe_api_key.get_secret_value(), settings.stripe_api_base,
                         settings.stripe_timeout_seconds)


def seed(settings: Settings, batch: int = 0) -> None:
    try:
        seed_scenarios(Database(settings.database), gateway_for(settings), batch)
    except stripe.StripeError as err:
        raise StarterError(f"cannot reach the payment provider at {settings.stripe_api_base}: "
                           f"{type(err).__name__}") from None


async def start_task(client: Client, settings: Settings, task: TaskInput) -> WorkflowHandle:
    """Start the task, or attach to it when a run with this id is going or has completed.

    A completed task is never run again by a plain start (redrive is explicit); a failed or
    terminated one may be, and its intent keys make the done steps come back already_performed.
    Approvers, ceilings and the escalation deadline are the worker's, not the starter's.
    """
    try:
        return await client.start_workflow(
            WORKFLOW_NAME, task, id=task.task_id, task_queue=settings.task_queue, result_type=TaskResult,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
            task_timeout=_TASK_TIMEOUT,
        )
    except WorkflowAlreadyStartedError:
        return client.get_workflow_handle(task.task_id, result_type=TaskResult)


async def follow(handle: WorkflowHandle, show: bool) -> TaskResult:
    """Wait for the result, printing each step as its status changes."""
    result = asyncio.ensure_future(handle.result())
    seen: dict[str, str] = {}
    while not result.done():
        if show:
            try:
                cp: Checkpoint = await handle.query("checkpoint", result_type=Checkpoint)
                wait = cp.waiting_for
                if wait is not None and seen.get("#wait") != wait.intent_key:
                    seen["#wait"] = wait.intent_key
                    print(f"  {cp.task_id}  waits for a human: {wait.reason} on {wait.tool} ({wait.detail})\n"
                          f"      decide: python starter.py resolve {cp.task_id} {wait.allowed[0]} --by YOU --key-file YOU.pem"
                          f"   (allowed: {', '.join(wait.allowed)}; deadline {wait.deadline})", flush=True)
                for name, step in cp.steps.items():
                    line = f"{step.status}{' ' + step.outcome if step.outcome else ''}"
                    if seen.get(name) != line:
                        seen[name] = line
                        print(f"  {cp.task_id}  {name:<22} {line}", flush=True)
            except RPCError:
                pass
        await asyncio.wait([result], timeout=0.5)
    return result.result()


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
    print(f"   Web UI: {settings.temporal_ui_url}/namespaces/{settings.temporal_namespace}/workflows/{task.task_id}")


async def run_tasks(settings: Settings, tasks: list[TaskInput], as_json: bool) -> list[dict[str, Any]]:
    client = await connect(settings)
    handles = [await start_task(client, settings, task) for task in tasks]
    show = not as_json and len(tasks) <= 3
    results = await asyncio.gather(*(follow(h, show) for h in handles))
    summaries = []
    for task, result in zip(tasks, results):
        world = world_of(settings, task)
        summaries.append({"task_id": task.task_id, "scenario": task.scenario, "state": result.state,
                          "final_answer": result.final_answer, "world": world,
                          "checkpoint": result.checkpoint.model_dump(mode="json")})
        if not as_json and len(tasks) <= 3:
            print_report(settings, task, result, world)
    return summaries


def inject(settings: Settings, scenario: str, fault: str | None, mode: str) -> EdgeControl | None:
    """Set the Stripe edge's mode and the fault on the scenario's first money request."""
    if fault is None and mode == "dedupe":
        return None
    edge = EdgeControl(settings.stripe_api_base)
    path = "/v1/payment_intents" if scenario == "INV-9" else "/v1/refunds"
    try:
        edge.configure(mode, preset(fault, path, settings.stripe_timeout_seconds) if fault else [])
    except OSError as err:
        raise StarterError(f"--fault and --edge-mode need the local Stripe edge at {settings.stripe_api_base} "
                           f"(make up): {err}") from None
    return edge


def print_faults(edge: EdgeControl | None) -> None:
    if edge is not None:
        injected = {k.removeprefix("fault:"): v for k, v in edge.stats().items() if k.startswith("fault:")}
        print(f"   faults injected at the Stripe edge: {injected or 'none'}")


async def cmd_scenario(args: argparse.Namespace, settings: Settings) -> int:
    options = {"repeat_effects": args.repeat_effects} if args.repeat_effects else {}
    task = SCENARIOS[args.name](**options)
    seed(settings)
    edge = inject(settings, args.name, args.fault, args.edge_mode)
    summaries = await run_tasks(settings, [task], args.json)
    if args.json:
        print(json.dumps(summaries[0], indent=2))
    else:
        print_faults(edge)
    return 0


async def cmd_compare(args: argparse.Namespace, settings: Settings) -> int:
    """The same fault through our refund tool and through a naive one (uuid4 key, "refund failed")."""
    order_id, build = REFUND_SCENARIOS[args.name]
    run_id = datetime.now(timezone.utc).strftime("%H%M%S")
    seed(settings)
    gateway, records = gateway_for(settings), Records(Database(settings.database))
    base = records.order(order_id).order
    rows = []
    client = await connect(settings)
    for tool in ("safe", "unsafe"):
        order = base.model_copy(update={"order_id": f"{order_id}-{tool[0].upper()}{run_id}"})
        seed_order(records, gateway, order)
        task = build(order_id=order.order_id)
        edge = inject(settings, args.name, args.fault, args.edge_mode)
        queue = settings.task_queue if tool == "safe" else f"{settings.task_queue}-unsafe"
        if tool == "safe":
            result = await follow(await start_task(client, settings, task), show=False)
        else:
            unsafe = settings.model_copy(update={"task_queue": queue})
            try:
                naive_worker = build_worker(client, unsafe, queue, replace=[naive_refund(settings)])
            except ModelConfigError as err:
                raise StarterError(str(err)) from None
            async with naive_worker:
                result = await follow(await start_task(client, unsafe, task), show=False)
        refunds = World(Database(settings.database), gateway).refunds(order.order_id)
        rows.append((tool, task.task_id, result, refunds, edge.stats() if edge else {}))
    print(f"{args.fault or 'no fault'}, provider {'dedupes' if args.edge_mode == 'dedupe' else 'ignores'} keys")
    for tool, task_id, result, refunds, stats in rows:
        paid = sum(r["amount_cents"] for r in refunds) / 100
        print(f"  {tool:<7} {task_id:<28} provider refunds: {len(refunds)} ({paid:.2f})   "
              f"model told: {result.checkpoint.steps['issue_refund'].trail}")
    return 0


async def cmd_batch(args: argparse.Namespace, settings: Settings) -> int:
    tasks = [batch_ticket(n) for n in range(1, args.count + 1)]
    seed(settings, batch=args.count)
    started = time.monotonic()
    summaries = await run_tasks(settings, tasks, args.json)
    elapsed = time.monotonic() - started
    refunds = sum(len(s["world"]["refunds"]) for s in summaries)
    report = {"tasks": len(tasks), "completed": sum(s["state"] == "completed" for s in summaries),
              "provider_refunds": refunds, "seconds": round(elapsed, 2)}
    print(json.dumps({**report, "tasks_detail": summaries} if args.json else report, indent=2))
    return 0


async def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    client = await connect(settings)
    try:
        cp = await client.get_workflow_handle(args.task_id).query("checkpoint", result_type=Checkpoint)
    except RPCError as err:
        raise StarterError(f"no task {args.task_id}: {err.message}") from None
    print(cp.model_dump_json(indent=2))
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
        cp = await query_checkpoint(client, args.task_id)
        if cp.waiting_for is None:
            raise StarterError(f"{args.task_id} is {cp.state}, not waiting for a decision")
        intent_key = cp.waiting_for.intent_key
    try:
        decision = ResolveInput(task_id=args.task_id, intent_key=intent_key, decision=args.decision,
                                decided_by=args.by, note=args.note, provider_ref=args.provider_ref)
    except ValidationError as err:
        raise StarterError(f"bad decision: {err.errors()[0]['msg']}") from None
    return sign(decision, key, timedelta(minutes=args.valid_for))


async def query_checkpoint(client: Client, task_id: str) -> Checkpoint:
    try:
        return await client.get_workflow_handle(task_id).query("checkpoint", result_type=Checkpoint)
    except RPCError as err:
        raise StarterError(f"no task {task_id}: {err.message}") from None


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


async def redrive(client: Client, settings: Settings, task_id: str, force: bool = False
                  ) -> tuple[WorkflowHandle, TaskInput, str]:
    """Start a dead-lettered (or failed, cancelled) task again with its original input.

    Done effects come back already_performed from the ledger: the intent keys are the same.
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
    task = task.model_copy(update={"redrive_of": description.run_id})
    new = await client.start_workflow(
        WORKFLOW_NAME, task, id=task.task_id, task_queue=settings.task_queue, result_type=TaskResult,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE, task_timeout=_TASK_TIMEOUT)
    mark_redriven(Database(settings.database), task.task_id)
    return new, task, state


async def cmd_redrive(args: argparse.Namespace, settings: Settings) -> int:
    client = await connect(settings)
    handle, task, was = await redrive(client, settings, args.task_id, args.force)
    print(f"redriving {task.task_id} (was {was}, run {task.redrive_of}) as run {handle.result_run_id}")
    if args.no_wait:
        return 0
    result = await follow(handle, show=True)
    print_report(settings, task, result, world_of(settings, task))
    return 0


async def cmd_waiting(args: argparse.Namespace, settings: Settings) -> int:
    """Tasks in a state, found through the AgentStatus search attribute."""
    client = await connect(settings)
    query = f'AgentStatus="{args.status}"'
    async for execution in client.list_workflows(query):
        cp = await client.get_workflow_handle(execution.id).query("checkpoint", result_type=Checkpoint) \
            if args.status == "awaiting_human" else None
        wait = cp.waiting_for if cp else None
        detail = f"{wait.reason} on {wait.tool}, key {wait.intent_key}" if wait else ""
        print(f"{execution.id:<32} {args.status:<15} {detail}")
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


async def cmd_seed(args: argparse.Namespace, settings: Settings) -> int:
    seed(settings, batch=args.batch)
    print(f"seeded scenarios{f' and {args.batch} batch orders' if args.batch else ''} into {settings.agent_db_path}")
    return 0


def add_fault_options(p: argparse.ArgumentParser, default_fault: str | None = None) -> None:
    p.add_argument("--fault", choices=FAULT_PRESETS, default=default_fault,
                   help="inject this fault on the first money request at the local Stripe edge")
    p.add_argument("--edge-mode", choices=["dedupe", "passthrough"], default="dedupe",
                   help="the edge honours idempotency keys as Stripe does (dedupe) or ignores them")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Start agent tasks and show what they did.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("scenario", help="run one scenario of DESIGN.md")
    s.add_argument("name", choices=sorted(SCENARIOS))
    s.add_argument("--repeat-effects", type=int, default=0, metavar="N",
                   help="the model asks again N times for each money effect already done")
    s.add_argument("--json", action="store_true")
    add_fault_options(s)
    s.set_defaults(run=cmd_scenario)
    c = sub.add_parser("compare", help="run a refund scenario through our tool and a naive one, same fault")
    c.add_argument("name", choices=sorted(REFUND_SCENARIOS))
    add_fault_options(c, default_fault="timeout-after-accept")
    c.set_defaults(run=cmd_compare)
    b = sub.add_parser("batch", help="run N generated refund tickets")
    b.add_argument("count", type=int)
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
    rd.add_argument("--no-wait", action="store_true")
    rd.set_defaults(run=cmd_redrive)
    ls = sub.add_parser("list", help="tasks by status (AgentStatus search attribute)")
    ls.add_argument("--status", default="awaiting_human",
                    choices=["running", "awaiting_human", "completed", "dead_lettered", "cancelled"])
    ls.set_defaults(run=cmd_waiting)
    rc = sub.add_parser("reconcile", help="compare the ledger with the provider now; exit 1 on findings")
    rc.add_argument("--stale-after", type=int, default=900, metavar="SECONDS")
    rc.set_defaults(run=cmd_reconcile)
    sd = sub.add_parser("seed", help="create the demo orders and payees at the provider")
    sd.add_argument("--batch", type=int, default=0)
    sd.set_defaults(run=cmd_seed)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    settings = load_settings()
    try:
        return asyncio.run(args.run(args, settings))
    except StarterError as err:
        print(f"starter: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
