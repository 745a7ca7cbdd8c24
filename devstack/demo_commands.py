"""The starter's demo commands (`scenario`, `compare`, `seed`, `batch N`): built-in scenarios on the
local stack, with faults injected at its Stripe edge. `starter.py` imports this module only when one
of them runs, so the product's commands need no devstack.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from datetime import datetime, timezone
from typing import Any, Iterator

import stripe

from activities.db import Database
from activities.records import Records
from activities.world import World
from core.models import TaskInput
from devstack import edge_control, scenarios
from devstack.seed import seed_order, seed_scenarios
from devstack.unsafe import naive_refund
from infra.settings import Settings
from starter import StarterError, connect, follow, gateway_for, run_tasks, start_task


def generated_tickets(settings: Settings, count: int) -> list[TaskInput]:
    """`batch N`: N generated refund tickets, their orders paid at the local provider."""
    seed(settings, batch=count)
    return [scenarios.batch_ticket(n) for n in range(1, count + 1)]


def seed(settings: Settings, batch: int = 0) -> None:
    try:
        seed_scenarios(Database(settings.database), gateway_for(settings), batch)
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
            f"F{datetime.now(timezone.utc).strftime('%m%d%H%M%S')}"
        task = fresh_scenario(settings, args.name, suffix, args.task_id, options)
    else:
        task = scenarios.SCENARIOS[args.name](**options)
    with edge_faults(settings, args.name, args.fault, args.edge_mode) as edge:
        summaries = await run_tasks(settings, [task], args.json)
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
    from worker import build_worker
    from activities.model import ModelConfigError

    order_id, build = scenarios.REFUND_SCENARIOS[args.name]
    run_id = datetime.now(timezone.utc).strftime("%H%M%S")
    seed(settings)
    records = Records(Database(settings.database))
    rows = []
    client = await connect(settings)
    for tool in ("safe", "unsafe"):
        task = fresh_scenario(settings, args.name, f"{tool[0].upper()}{run_id}", None, {})
        queue = settings.task_queue if tool == "safe" else f"{settings.task_queue}-unsafe"
        with edge_faults(settings, args.name, args.fault, args.edge_mode) as edge:
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
            stats = edge.stats() if edge else {}
        refunds = World(Database(settings.database), gateway_for(settings)).refunds(task.facts["order_id"])
        if tool == "unsafe":
            records.forget_order(task.facts["order_id"])
        rows.append((tool, task.task_id, result, refunds, stats))
    print(f"{args.fault or 'no fault'}, provider {'dedupes' if args.edge_mode == 'dedupe' else 'ignores'} keys")
    for tool, task_id, result, refunds, stats in rows:
        paid = sum(r["amount_cents"] for r in refunds) / 100
        print(f"  {tool:<7} {task_id:<28} provider refunds: {len(refunds)} ({paid:.2f})   "
              f"model told: {result.checkpoint.steps['issue_refund'].trail}")
    return 0


async def cmd_seed(args: argparse.Namespace, settings: Settings) -> int:
    seed(settings, batch=args.batch)
    print(f"seeded scenarios{f' and {args.batch} batch orders' if args.batch else ''} into {settings.agent_db_path}")
    return 0
