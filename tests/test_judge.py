"""The independent judge (devstack/judge/) on the real stack: it passes a clean run, and fails a run
in which a refund was duplicated behind the product's back (created at the provider through the
stripe SDK), one in which a message was sent twice (an extra outbox row), and one in which a ticket's
refund is missing (the ticket completed without refunding). Each run: a few batch tickets through an
in-process worker, the worker stopped, the settle horizons waited out, then the judge. Last, on
records made up in the test: the count of escalations about settled intents."""

from __future__ import annotations

import sqlite3
import time

import stripe
from temporalio.client import Client

from activities.world import World
from core.models import TaskInput
from devstack.judge import Ticket, Verdict, judge, table, wait_until_quiet
from devstack.judge.checks import weigh
from devstack.judge.ledger import Alert, Effect, LedgerRecords, Message
from devstack.judge.ledger import OrderRow as LedgerOrder
from devstack.judge.provider import Payment, ProviderRecords, Refund
from devstack.judge.tasks import EndState
from devstack.scenarios import INVOICES, batch_order, batch_ticket
from devstack.seed import seed_scenarios
from devstack.stack import STRIPE_API_KEY
from infra.settings import Settings
from tests.helpers import finished, running_worker, scenario_task, start, unique

ORDERS = 2


def price(order: int) -> int:
    return batch_order(order).items[0].amount_cents


def ticket(order: int, cents: int | None = None, **options) -> tuple[TaskInput, Ticket]:
    """A batch ticket for the order's item (in full unless `cents`), and what the judge expects of it."""
    cents = price(order) if cents is None else cents
    task = batch_ticket(order, amount_cents=cents, **options)
    task = task.model_copy(update={"task_id": unique(task.task_id)})
    return task, Ticket(task.task_id, order_id=batch_order(order).order_id, item_id="item-1", refund_cents=cents)


async def run(client: Client, settings: Settings, world: World, tasks: list[TaskInput]) -> None:
    """Run the tickets to their end, then stop the worker (leaving the block) and wait out the horizons."""
    seed_scenarios(world.records.db, world.gateway, ORDERS)
    async with running_worker(client, settings):
        handles = [await start(client, settings, t) for t in tasks]
        for handle in handles:
            await finished(handle, 120)
    await wait_until_quiet(settings.database)


async def verdict(client: Client, settings: Settings, tickets: list[Ticket]) -> Verdict:
    found = await judge(tickets, provider_url=settings.stripe_api_base, api_key=STRIPE_API_KEY,
                        database=settings.database, client=client)
    print(table(found))
    return found


def kinds(found: Verdict) -> set[str]:
    return {f.kind for f in found.findings}


async def test_a_clean_run_passes(client: Client, settings: Settings, world: World):
    part = price(2) // 3
    runs = [ticket(1), ticket(2, part), ticket(2, price(2) - part)]  # one in full, one item split in two
    invoice = scenario_task("INV-9")  # and a supplier invoice paid
    runs.append((invoice, Ticket(invoice.task_id, invoice_id="INV-9", payment_cents=INVOICES["INV-9"].amount_cents)))
    await run(client, settings, world, [task for task, _ in runs])

    found = await verdict(client, settings, [t for _, t in runs])
    shown = table(found)
    assert found.ok and not found.findings, shown
    assert {t.end.state for t in found.tickets.values()} == {"completed"}, shown
    assert [m.status for m in found.items.values()] == ["as expected"] * ORDERS, shown
    assert found.items[f"{batch_order(2).order_id}/item-1"].moved == price(2), shown
    assert found.invoices["INV-9"].status == "as expected" and len(found.invoices["INV-9"].ids) == 1, shown
    assert all(list(t.messages.values()) == ["one"] for t in found.tickets.values()), shown
    assert found.tickets[invoice.task_id].messages == {INVOICES["INV-9"].payee_email: "one"}, shown
    assert "negative control: 0 of 0 flagged" in shown and "escalations about settled intents: 0" in shown


async def test_a_refund_duplicated_behind_the_products_back_fails(client: Client, settings: Settings,
                                                                 world: World):
    runs = [ticket(1), ticket(2)]
    await run(client, settings, world, [task for task, _ in runs])
    order = batch_order(1)
    [original] = world.refunds(order.order_id)
    sdk = stripe.StripeClient(STRIPE_API_KEY, base_addresses={"api": settings.stripe_api_base})
    sdk.v1.refunds.create(params={  # the same refund again, metadata and all, as a second payer would send it
        "payment_intent": world.records.order(order.order_id).payment_intent_id, "amount": original["amount_cents"],
        "metadata": {"task_id": original["task_id"], "item_id": original["item_id"],
                     "intent_key": original["intent_key"]}})

    found = await verdict(client, settings, [t for _, t in runs])
    assert not found.ok and found.flagged == {runs[0][1].task_id}, table(found)
    assert {"too many", "one ticket, several", "one intent, several"} <= kinds(found), table(found)
    assert found.items[f"{order.order_id}/item-1"].status == "too many"


async def test_a_message_sent_twice_fails(client: Client, settings: Settings, world: World):
    runs = [ticket(1), ticket(2)]
    await run(client, settings, world, [task for task, _ in runs])
    twice = runs[1][1].task_id
    with sqlite3.connect(settings.database) as db:  # the customer's message once more, under another key
        db.execute("INSERT INTO outbox (intent_key, task_id, kind, recipient, subject, body, created_at)"
                   " SELECT intent_key || ':again', task_id, kind, recipient, subject, body, ?"
                   " FROM outbox WHERE task_id = ?", (time.time(), twice))

    found = await verdict(client, settings, [t for _, t in runs])
    assert not found.ok and found.flagged == {twice}, table(found)
    assert kinds(found) == {"message sent twice"}, table(found)
    assert found.tickets[twice].messages == {batch_order(2).customer_email: "2, identical"}


async def test_a_missing_refund_fails(client: Client, settings: Settings, world: World):
    order = batch_order(2)
    # The model looks the order up and writes to the customer, and never refunds: the task completes.
    calls = [{"name": "get_order", "arguments": f'{{"order_id": "{order.order_id}"}}'},
             {"name": "notify_customer", "arguments": f'{{"order_id": "{order.order_id}", '
                                                      '"message": "We are sorry your order arrived damaged."}'}]
    runs = [ticket(1), ticket(2, script_calls=calls)]
    await run(client, settings, world, [task for task, _ in runs])

    found = await verdict(client, settings, [t for _, t in runs])
    missing = runs[1][1].task_id
    assert found.tickets[missing].end.state == "completed", table(found)
    assert not found.ok and found.flagged == {missing}, table(found)
    assert kinds(found) == {"too few"}, table(found)
    assert found.items[f"{order.order_id}/item-1"].status == "too few"


def test_an_escalation_about_a_settled_intent_is_counted():
    """The count of escalations about settled intents is a real check, on records made up here: a person
    asked about an intent whose refund the provider already held, another about one the ledger already
    said was not performed, and a third about an intent nothing had settled yet."""
    order = LedgerOrder("B-1", "pi_1", {"customer_email": "c@x", "items": [{"item_id": "i", "amount_cents": 500}]})
    refund = Refund("re_1", 500, "succeeded", created=1000, charge="ch_1", payment_intent="pi_1",
                    metadata={"task_id": "t", "item_id": "i", "intent_key": "k-held"})
    provider = ProviderRecords([refund], [Payment("pi_1", 500, "succeeded", 900, "cus_1", "ch_1", {"order_id": "B-1"})])
    effects = {"k-held": Effect("k-held", "t", "issue_refund", "performed", "re_1", 500, 1000.5),
               "k-not": Effect("k-not", "t", "issue_refund", "not_performed", None, 500, 1000.0),
               "k-open": Effect("k-open", "t", "issue_refund", "unknown", None, 500, 1000.0)}
    alerts = [Alert("t", f"a-{key}", "escalation", "unknown_outcome", key, "?", 1010.0)
              for key in ("k-held", "k-not", "k-open")]
    ledger = LedgerRecords(effects, [], {"B-1": order}, {}, alerts)
    tickets = [Ticket("t", order_id="B-1", item_id="i", refund_cents=500)]

    found = weigh(tickets, provider, ledger, {"t": EndState("awaiting_human")}, {"a-k-held": 1002.0})
    assert [(e.intent_key, bool(e.settled)) for e in found.escalations] == [
        ("k-held", True), ("k-not", True), ("k-open", False)], table(found)
    assert "escalations about settled intents: 2" in table(found)
    assert not found.ok
    # Asked within the second the refund was created, before the ledger knew: the provider's whole
    # seconds cannot tell which came first, so it is not counted.
    asked_early = weigh(tickets, provider, ledger, {"t": EndState("awaiting_human")}, {"a-k-held": 1000.4})
    assert not asked_early.escalations[0].settled


def test_a_message_whose_money_claims_the_provider_contradicts_is_false():
    """On records made up here: the provider holds the ticket's refund re_1 of 5.00. The product's own
    sentence and a plain true one pass; a reference it does not hold, an amount it never refunded,
    "not issued" beside the refund, and "on its way" where nothing moved are each a false message."""
    order = LedgerOrder("B-1", "pi_1", {"customer_email": "c@x", "items": [{"item_id": "i", "amount_cents": 500}]})
    refund = Refund("re_1", 500, "succeeded", created=1000, charge="ch_1", payment_intent="pi_1",
                    metadata={"task_id": "t", "item_id": "i", "intent_key": "k"})
    paid = Payment("pi_1", 500, "succeeded", 900, "cus_1", "ch_1", {"order_id": "B-1"})
    other = LedgerOrder("B-2", "pi_2", {"customer_email": "d@x", "items": [{"item_id": "i", "amount_cents": 700}]})
    provider = ProviderRecords([refund], [paid, Payment("pi_2", 700, "succeeded", 900, "cus_2", "ch_2", {})])
    effects = {"k": Effect("k", "t", "issue_refund", "performed", "re_1", 500, 1000.5)}
    tickets = [Ticket("t", order_id="B-1", item_id="i", refund_cents=500),
               Ticket("u", order_id="B-2", item_id="i", refund_cents=700)]

    def judged(body_t: str, body_u: str = "We are looking into it.") -> list[str]:
        outbox = [Message("m-t", "t", "email", "c@x", "s", body_t), Message("m-u", "u", "email", "d@x", "s", body_u)]
        ledger = LedgerRecords(effects, outbox, {"B-1": order, "B-2": other}, {}, [])
        found = weigh(tickets, provider, ledger, {"t": EndState("completed"), "u": EndState("awaiting_human")}, {})
        return [f.detail for f in found.findings if f.kind == "false message"]

    assert judged("Sorry.\n\nRefund issued: 5.00 USD for item i of order B-1, reference re_1.") == []
    assert judged("Your refund went through.", "No refund has been issued for item i of order B-2.") == []
    assert judged("Refund issued: 5.00 USD for item i of order B-1, reference re_9.")  # not the provider's
    assert judged("We refunded 7.00 USD, reference re_1.")                             # not its amount
    assert judged("Unfortunately your refund has not been issued.")                     # re_1 is there
    assert judged("Refund issued.", "Your refund is on its way.")                       # nothing moved for u
    # A denial counts only in a sentence that names money: a pickup label not sent says nothing of it.
    assert judged("Your refund went through. Your pickup label has not been sent yet.") == []
    assert judged("Your pickup label is sent. Your refund has not been sent.")               # re_1 is there
