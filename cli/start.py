"""`start` and `batch`: tasks from tickets of your own."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from pydantic import ValidationError

from cli.output import STARTER, Progress, print_report, summary, ui_link
from client import ClientError, Ticket, connect, follow, read_ticket_file, start_ticket, started_now
from client.tickets import TicketError
from core.kinds import TICKETS
from infra.settings import Settings


def _tickets(path: Path) -> list[Ticket]:
    try:
        return read_ticket_file(path)
    except TicketError as err:
        raise ClientError(str(err)) from None


def _ticket(args: argparse.Namespace) -> Ticket:
    if args.file:
        tickets = _tickets(args.file)
        if len(tickets) != 1:
            raise ClientError(f"{args.file} holds {len(tickets)} tickets; `batch {args.file}` starts them all")
        return tickets[0]
    if not (args.kind and args.ticket_id and args.text):
        raise ClientError("start needs a kind, a ticket id and --text (or --file ticket.json)")
    facts = {k: v for k, v in (("order_id", args.order), ("item_id", args.item), ("invoice_id", args.invoice)) if v}
    try:
        return Ticket(kind=args.kind, ticket_id=args.ticket_id, text=args.text, facts=facts)
    except ValidationError as err:
        first = err.errors()[0]
        raise ClientError(f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None


async def cmd_start(args: argparse.Namespace, settings: Settings) -> int:
    ticket = _ticket(args)
    task_id = f"ticket-{ticket.ticket_id}"
    client = await connect(settings)
    handle = await start_ticket(client, settings, ticket)
    if not args.json:
        print(f"{task_id}: {'started' if started_now(handle) else 'attached to the task started before'}; "
              f"Web UI {ui_link(settings, task_id)}", flush=True)
    if args.no_wait:
        return 0
    progress = None if args.json else Progress(hint_ctrl_c=not args.until_waiting)
    result = await follow(handle, progress, until_waiting=args.until_waiting,
                          on_wait=progress.waits if progress else None)
    if result is None:
        if args.json:
            print(json.dumps({"task_id": task_id, "state": "awaiting_human"}))
        else:
            print(f"{task_id} waits for a person; `{STARTER} list` shows why")
        return 0
    if args.json:
        print(json.dumps({**summary(result), **({"checkpoint": result.checkpoint.model_dump(mode="json")}
                                                 if args.details else {})}, indent=2))
    else:
        print_report(settings, result, args.details)
    return 0


async def cmd_batch(args: argparse.Namespace, settings: Settings) -> int:
    tickets = _tickets(Path(args.file))
    started = time.monotonic()
    client = await connect(settings)
    handles = [await start_ticket(client, settings, ticket) for ticket in tickets]
    results = await asyncio.gather(*(follow(h, until_waiting=True) for h in handles))
    done = [summary(r) for r in results if r is not None]
    report = {"tasks": len(tickets), "completed": sum(s["state"] == "completed" for s in done),
              "awaiting_human": sum(r is None for r in results), "seconds": round(time.monotonic() - started, 2)}
    print(json.dumps({**report, "tasks_detail": done} if args.json else report, indent=2))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    t = sub.add_parser("start", help="start a task from a ticket of your own (or attach to it)")
    t.add_argument("kind", nargs="?", choices=sorted(TICKETS),
                   help="; ".join(f"{name}: {kind.description}" for name, kind in TICKETS.items()))
    t.add_argument("ticket_id", nargs="?", help="your ticket's id; the task is ticket-<id>")
    t.add_argument("--text", help="the ticket's text, as the customer or colleague wrote it")
    t.add_argument("--order", help="fact: the order the ticket is about")
    t.add_argument("--item", help="fact: the item of the order the agent may refund (several: comma separated)")
    t.add_argument("--invoice", help="fact: the invoice (payables)")
    t.add_argument("--file", type=Path, help="a JSON ticket: kind, ticket_id, text, facts")
    t.add_argument("--no-wait", action="store_true", help="start it and return")
    t.add_argument("--until-waiting", action="store_true",
                   help="watch it until it completes or waits for a person, then return")
    t.add_argument("--details", action="store_true", help="also print the whole checkpoint")
    t.add_argument("--json", action="store_true", help="print JSON only")
    t.set_defaults(run=cmd_start)
    b = sub.add_parser("batch", help="start the tickets of a JSONL file (one a line); wait until each ends or "
                                     "waits for a person")
    b.add_argument("file", metavar="FILE", help="a .jsonl file of tickets, one a line")
    b.add_argument("--json", action="store_true")
    b.set_defaults(run=cmd_batch)
