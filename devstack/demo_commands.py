"""The local stack's demo commands (`python -m devstack scenario|compare|seed|batch`): built-in
scenarios on the local stack, with faults injected at its Stripe edge, and demo data at its
provider. They print the world as well as the task (the provider's refunds, the outbox), which a
demo may read directly; the product's own commands (starter.py) read tasks through Temporal only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import stripe

from activities.db import Database
from activities.payments import StripeGateway
from activities.records import Records
from activities.world import World
from cli.output import Progress, print_report
from client import ClientError, connect, follow, read_ticket_file, start_task
from client.tickets import TicketError
from core.kinds import fact_values
from core.models import TaskInput, TaskResult
from devstack import edge_control, scenarios
from devstack.seed import seed_order, seed_scenarios
from devstack.unsafe import naive_refund
from infra.settings import Settings

StarterError = ClientError  # the demo's errors print as the starter's: one line
EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"


def gateway_for(settings: Settings) -> StripeGateway:
    return StripeGateway(settings.stripe_api_key.get_secret_value(), settings.stripe_api_base,
                         settings.stripe_timeout_seconds)


def amount_of(settings: Settings, task: TaskInput) -> int | None:
    """What the task's order items (or invoice) cost, from the local stack's records: for its summary."""
    records = Records(Database(settings.database))
    order_id, invoice_id = task.facts.get("order_id"), task.facts.get("invoice_id")
    if order_id and (record := records.order(order_id)):
        named = fact_values(task.facts, "item_id")
        items = [i for i in record.order.items if not named or i.item_id in named]
        return sum(i.amount_cents for i in items) if items else None
    if invoice_id and (invoice := records.invoice(invoice_id)):
        return invoice.invoice.amount_cents
    return None


def world_of(settings: Settings, task: TaskInput) -> dict[str, Any]:
    world = World(Database(settings.database), gateway_for(settings))
    return world.summary(task.task_id, task.facts.get("order_id"), task.facts.get("invoice_id"))


def print_world(world: dict[str, Any]) -> None:
    for refund in world["refunds"]:
        print(f"  provider refund  {refund['id']}  {refund['amount_cents'] / 100:.2f}  key {refund['intent_key']}")
    for payment in world["payments"]:
        print(f"  provider payment {payment['id']}  {payment['amount_cents'] / 100:.2f}  key {payment['intent_key']}")
    for message in world["messages"]:
        print(f"  sent {message['kind']:<15} to {message['recipient']}: {message['body'][:70]}")


async def run_tasks(settings: Settings, tasks: list[TaskInput], as_json: bool,
                    details: bool = False) -> list[dict[str, Any]]:
    client = await connect(settings)
    handles = [await start_task(client, settings, task, amount_of(settings, task)) for task in tasks]
    show = not as_json and len(tasks) <= 3
    progress = [Progress() if show else None for _ in handles]
    results: list[TaskResult | None] = await asyncio.gather(
        *(follow(h, p, on_wait=p.waits if p else None) for h, p in zip(handles, progress, strict=True)))
    summaries = []
    for task, result in zip(tasks, results, strict=True):
        assert result is not None
        world = world_of(settings, task)
        summaries.append({"task_id": task.task_id, "scenario": task.scenario, "state": result.state,
                          "final_answer": result.final_answer, "world": world,
                          "checkpoint": result.checkpoint.model_dump(mode="json")})
        if show:
            print_report(settings, result, details)
            print_world(world)
    return summaries


def generated_tickets(settings: Settings, count: int) -> list[TaskInput]:
    """`batch N`: N generated refund tickets, their orders paid at the local provider."""
    seed(settings, batch=count)
    return [scenarios.batch_ticket(n) for n in range(1, count + 1)]


def seed(settings: Settings, batch: int = 0, ticket_files: tuple[Path, ...] = ()) -> None:
    """The scenarios' orders and invoices, `batch` generated orders, and the orders the example tickets
    (and `ticket_files`) carry, paid at the local provider."""
    try:
        tickets = [t for path in (*sorted(EXAMPLES.glob("*.json*")), *ticket_files) for t in read_ticket_file(path)]
    except TicketError as err:
        raise StarterError(str(err)) from None
    db = Database(settings.database)
    try:
        seed_scenarios(db, gateway_for(settings), batch)
        for ticket in tickets:
            if ticket.order is not None:
                seed_order(Records(db), gateway_for(settings), ticket.order)
    except stripe.StripeError as err:
        raise StarterError(f"cannot reach the payment provider at {settings.stripe_api_base}: "
                           f"{type(err).__name__}") from None


@contextlib.contextmanager
def edge_faults(settings: Settings, scenario: str, fault: str | None, mode: str) -> Iterator[Any]:
    """Set the Stripe edge's mode and a fault on the scenario's first money request, for this block only.

    Whatever happens in the block (an error, Ctrl-C), the edge gets back the configuration it had
    before, so no later task, scenario or seeding meets a fault meant for this one. Yields the edge
    control (None when there is nothing to inject).
    """
    if fault is None and mode == "dedupe":
        yield None
        return
    if fault is not None and fault not in edge_control.FAULT_PRESETS:
        raise StarterError(f"unknown fault {fault}; one of {', '.join(edge_control.FAULT_PRESETS)}")
    edge = edge_control.EdgeControl(settings.stripe_api_base)
    path = "/v1/payment_intents" if scenario == "INV-9" else "/v1/refunds"
    try:
        before = edge.current()
        edge.configure(mode, edge_control.preset(fault, path, settings.stripe_timeout_seconds) if fault else [])
    except OSError as err:
        raise StarterError(f"--fault and --edge-mode need the local Stripe edge at {settings.stripe_api_base} "
                           f"(make up): {err}") from None
    try:
        yield edge
    finally:
        try:
            edge.restore(before)
        except OSError as err:
            print(f"starter: could not restore the Stripe edge at {settings.stripe_api_base}: {err}",
                  file=sys.stderr)


def print_faults(stats: dict[str, int] | None) -> None:
    if stats is not None:
        injected = {k.removeprefix("fault:"): v for k, v in stats.items() if k.startswith("fault:")}
        print(f"   faults injected at the Stripe edge: {injected or 'none'}")


def fresh_scenario(settings: Settings, name: str, suffix: str, task_id: str | None,
                   options: dict[str, Any]) -> TaskInput:
    """The scenario as a new task on its own copy of the scenario's order (or invoice), paid at the provider.

    A fault needs a task that has not run yet on an order nothing was refunded from, so each such
    run gets `<order>-<suffix>` and the task id that goes with it.
    """
    records, gateway = Records(Database(settings.database)), gateway_for(settings)
    try:
        if name == "INV-9":
            invoice = scenarios.INVOICES["INV-9"].model_copy(update={"invoice_id": f"INV-9-{suffix}"})
            records.put_invoice(invoice, gateway.create_customer(invoice.payee, invoice.payee_email))
            task = scenarios.invoice_inv_9(**options)
            task = task.model_copy(update={
                "task_id": f"invoice-{invoice.invoice_id}", "facts": {"invoice_id": invoice.invoice_id},
                "brief": task.brief.replace("INV-9", invoice.invoice_id)})
        else:
            order_id, build = scenarios.REFUND_SCENARIOS[name]
            order = scenarios.ORDERS[order_id].model_copy(update={"order_id": f"{order_id}-{suffix}"})
            seed_order(records, gateway, order)
            task = build(order_id=order.order_id, **options)
    except stripe.StripeError as err:
        raise StarterError(f"cannot reach the payment provider at {settings.stripe_api_base}: "
                           f"{type(err).__name__}") from None
    return task.model_copy(update={"task_id": task_id}) if task_id else task


async def cmd_scenario(args: argparse.Namespace, settings: Settings) -> int:
    if args.name not in scenarios.SCENARIOS:
        raise StarterError(f"unknown scenario {args.name}; one of {', '.join(sorted(scenarios.SCENARIOS))}")
    options = {"repeat_effects": args.repeat_effects} if args.repeat_effects else {}
    seed(settings)
    if args.fault or args.task_id or args.edge_mode != "dedupe":
        # one alphanumeric suffix: the order's id reads as one id in the ticket's text
        suffix = re.sub(r"[^A-Za-z0-9]", "", args.task_id or "") or \
            f"F{datetime.now(UTC).strftime('%m%d%H%M%S')}"
        task = fresh_scenario(settings, args.name, suffix, args.task_id, options)
    else:
        task = scenarios.SCENARIOS[args.name](**options)
    with edge_faults(settings, args.name, args.fault, args.edge_mode) as edge:
        summaries = await run_tasks(settings, [task], args.json, args.details)
        stats = edge.stats() if edge else None
    if args.json:
        print(json.dumps(summaries[0], indent=2))
    else:
        print_faults(stats)
    return 0


async def cmd_compare(args: argparse.Namespace, settings: Settings) -> int:
    """The same fault through our refund tool and through a naive one (uuid4 key, "refund failed").

    Each side runs on its own new order. The naive side's order is dropped from our records
    afterwards: its duplicate refunds are the point of the demo, not something for the
    reconciliation to report every few minutes from then on.
    """
    if args.name not in scenarios.REFUND_SCENARIOS:
        raise StarterError(f"compare runs a refund scenario: one of {', '.join(sorted(scenarios.REFUND_SCENARIOS))}")
    from activities.model import ModelConfigError
    from worker import Extensions, build_worker

    _order_id, _build = scenarios.REFUND_SCENARIOS[args.name]
    run_id = datetime.now(UTC).strftime("%H%M%S")
    seed(settings)
    records = Records(Database(settings.database))
    rows = []
    client = await connect(settings)
    for tool in ("safe", "unsafe"):
        task = fresh_scenario(settings, args.name, f"{tool[0].upper()}{run_id}", None, {})
        queue = settings.task_queue if tool == "safe" else f"{settings.task_queue}-unsafe"
        with edge_faults(settings, args.name, args.fault, args.edge_mode) as edge:
            if tool == "safe":
                result = await follow(await start_task(client, settings, task))
            else:
                unsafe = settings.model_copy(update={"task_queue": queue})
                try:
                    naive_worker = build_worker(client, unsafe, queue,
                                                extensions=Extensions(replace=[naive_refund(settings)]))
                except ModelConfigError as err:
                    raise StarterError(str(err)) from None
                async with naive_worker:
                    result = await follow(await start_task(client, unsafe, task))
            stats = edge.stats() if edge else {}
        refunds = World(Database(settings.database), gateway_for(settings)).refunds(task.facts["order_id"])
        if tool == "unsafe":
            records.forget_order(task.facts["order_id"])
        rows.append((tool, task.task_id, result, refunds, stats))
    print(f"{args.fault or 'no fault'}, provider {'dedupes' if args.edge_mode == 'dedupe' else 'ignores'} keys")
    for tool, task_id, result, refunds, _stats in rows:
        paid = sum(r["amount_cents"] for r in refunds) / 100
        print(f"  {tool:<7} {task_id:<28} provider refunds: {len(refunds)} ({paid:.2f})   "
              f"model told: {result.checkpoint.steps['issue_refund'].trail}")
    return 0


async def cmd_seed(args: argparse.Namespace, settings: Settings) -> int:
    seed(settings, batch=args.batch, ticket_files=tuple(args.tickets))
    print(f"seeded the scenarios, the example tickets' orders{f' and {args.batch} batch orders' if args.batch else ''}"
          f" into {settings.agent_db_path}")
    return 0


async def cmd_batch(args: argparse.Namespace, settings: Settings) -> int:
    """N generated refund tickets, their orders paid at the local provider, run at once."""
    started = datetime.now(UTC)
    tasks = generated_tickets(settings, args.count)
    summaries = await run_tasks(settings, tasks, args.json)
    report = {"tasks": len(tasks), "completed": sum(s["state"] == "completed" for s in summaries),
              "provider_refunds": sum(len(s["world"]["refunds"]) for s in summaries),
              "seconds": round((datetime.now(UTC) - started).total_seconds(), 2)}
    print(json.dumps({**report, "tasks_detail": summaries} if args.json else report, indent=2))
    return 0


def add_fault_options(p: argparse.ArgumentParser, default_fault: str | None = None) -> None:
    p.add_argument("--fault", default=default_fault, metavar="FAULT",
                   help="inject this fault on the first money request at the local Stripe edge: "
                        "timeout-after-accept, error-after-commit, drop-after-commit, error-before-commit, "
                        "drop-before-commit, conflict-before-commit, unverifiable")
    p.add_argument("--edge-mode", choices=["dedupe", "passthrough"], default="dedupe",
                   help="the edge honours idempotency keys as Stripe does (dedupe) or ignores them")


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    s = sub.add_parser("scenario", help="run a built-in scenario (SU-88421, refund-8841, INV-9)")
    s.add_argument("name", metavar="NAME", help="SU-88421, refund-8841 or INV-9")
    s.add_argument("--repeat-effects", type=int, default=0, metavar="N",
                   help="the scripted model asks again N times for each money effect already done")
    s.add_argument("--task-id", help="run as a new task with this id, on its own order")
    s.add_argument("--details", action="store_true", help="also print the whole checkpoint")
    s.add_argument("--json", action="store_true")
    add_fault_options(s)
    s.set_defaults(demo=cmd_scenario)
    c = sub.add_parser("compare", help="a refund scenario through our tool and a naive one, same fault")
    c.add_argument("name", metavar="NAME", help="SU-88421 or refund-8841")
    add_fault_options(c, default_fault="timeout-after-accept")
    c.set_defaults(demo=cmd_compare)
    sd = sub.add_parser("seed", help="the demo orders, payees and example tickets' orders at the local provider")
    sd.add_argument("tickets", nargs="*", type=Path, metavar="TICKETS", help="more ticket files whose orders to seed")
    sd.add_argument("--batch", type=int, default=0)
    sd.set_defaults(demo=cmd_seed)
    b = sub.add_parser("batch", help="N generated refund tickets, run at once")
    b.add_argument("count", type=int, metavar="N")
    b.add_argument("--json", action="store_true")
    b.set_defaults(demo=cmd_batch)


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Run a demo command; a problem the operator can fix is one line on stderr."""
    try:
        return int(asyncio.run(args.demo(args, settings)))
    except ClientError as err:
        print(f"devstack {args.command}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"devstack {args.command}: stopped watching; started tasks go on in Temporal", file=sys.stderr)
        return 130
