"""Messages to people are checked before they are sent (issue 21, item 4): a message's money facts
are structured fields (`refund_status`, `item_id`) checked against the ledger and the provider, the
money sentence is written from the records, and free text that states money facts is refused.

Judged on the outbox and the provider's refunds, never on the model's reply."""

from __future__ import annotations

import json
import uuid

import pytest
from temporalio.client import Client

from activities.world import World
from core.claims import Paid, money_in_text, split_payment_statement, split_statement
from core.domain import Invoice
from core.kinds import TaskKind
from core.models import Outcome, TaskInput
from devstack.seed import seed_invoice
from infra.settings import Settings
from tests.helpers import finished, run, running_worker, start, waiting
from tests.test_money_boundary import fresh_order, refund_call, refund_task, scripted


def notify(order_id: str, message: str, **fields) -> dict:
    return {"tool": "notify_customer", "order_id": order_id, "message": message, **fields}


def script(order_id: str, item_id: str, calls: list[dict], name: str) -> TaskInput:
    return scripted(order_id, item_id, [dict(c) for c in calls], name=name)


def refusals(cp) -> dict[str, str | None]:
    return {name: step.reason for name, step in cp.steps.items() if step.tool == "notify_customer"}


async def test_told_issued_while_the_refund_waits_for_approval_nothing_is_sent(client: Client, settings: Settings,
                                                                               world: World):
    """(a) The refund is over the approval ceiling; the model tells the customer it was issued, in the
    structured field and in free text: nothing reaches the outbox, the model hears false_money_claim."""
    order = fresh_order(world, [("sofa", 20000)])
    task = script(order.order_id, "sofa", [
        notify(order.order_id, "Good news, everything is sorted.", refund_status="issued", item_id="sofa"),
        notify(order.order_id, "Your refund has been issued and is on its way."),
        refund_call(order.order_id, "sofa", 20000),
    ], name="lie-approval")
    async with running_worker(client, settings):
        handle = await start(client, settings, task)
        cp = await waiting(handle)
        assert cp.waiting_for.reason == "approval_required"
        assert world.messages(task.task_id) == []
        assert world.refunds(order.order_id) == []
        assert refusals(cp) == {"notify_customer": "false_money_claim", "notify_customer#2": "money_in_free_text"}
        first = cp.steps["notify_customer"]
        assert first.status == "not_performed" and first.asks == 1
        assert "records show not_issued" in first.result["message"]
        await handle.cancel()
        await finished(handle)
    assert world.messages(task.task_id) == []


async def test_refunded_then_denied_or_amount_in_free_text_is_refused_and_the_honest_message_is_sent(
        client: Client, settings: Settings, world: World):
    """(b) after a refund of 45.00, "not issued" (structured or free text) and "pending review" are
    refused; (c) free text with an amount is refused even beside a true status; (d) the honest message
    is sent, with the amount and the reference written from the ledger."""
    order = fresh_order(world, [("kettle", 4500)])
    oid = order.order_id
    lies = [
        notify(oid, "Thank you for your patience.", refund_status="not_issued", item_id="kettle"),
        notify(oid, "Thank you for waiting.", refund_status="not_issued"),
        notify(oid, "We are looking into it.", refund_status="pending_review", item_id="kettle"),
        notify(oid, "We were unable to process your refund of $118.00."),
        notify(oid, "Sorry: your refund has not been issued."),
        notify(oid, "You will see 45.00 back on your statement.", refund_status="issued", item_id="kettle"),
        notify(oid, "One hundred eighteen dollars are on the way back.", refund_status="issued"),
        notify(oid, "All good on our side.", refund_status="pending_review"),
    ]
    honest = notify(oid, "We are sorry your order arrived damaged.", refund_status="issued", item_id="kettle")
    task = script(oid, "kettle", [refund_call(oid, "kettle", 4500), *lies, honest], name="lie-after-refund")
    async with running_worker(client, settings):
        result = await run(client, settings, task)
    refunds = world.refunds(oid)
    assert [r["amount_cents"] for r in refunds] == [4500]
    sent = world.messages(task.task_id)
    assert len(sent) == 1, (result.state, result.final_answer,
                            [(n, s.reason, s.result.get("message")) for n, s in result.checkpoint.steps.items()])
    body = sent[0]["body"]
    ref = refunds[0]["id"]
    assert body == (f"We are sorry your order arrived damaged.\n\nRefund issued: 45.00 USD for item kettle of order "
                    f"{oid}, reference {ref}.")
    assert split_statement(body) == ("We are sorry your order arrived damaged.", (
        "issued", [{"item_id": "kettle", "amount_cents": 4500, "currency": "usd", "provider_ref": ref}]))
    reasons = [step.reason for name, step in result.checkpoint.steps.items() if step.tool == "notify_customer"]
    assert reasons == ["false_money_claim", "false_money_claim", "false_money_claim", "money_in_free_text",
                       "money_in_free_text", "money_in_free_text", "money_in_free_text", "false_money_claim", None]
    last = result.checkpoint.steps[f"notify_customer#{len(lies) + 1}"]
    assert last.status == "done" and last.result["money_statement"].endswith(f"reference {ref}.")


async def test_the_scripted_agent_s_messages_pass_with_the_money_sentence_from_the_ledger(
        client: Client, settings: Settings, world: World):
    """(d) The honest scripted agent states the refund with refund_status: its message is sent, and the
    amount and reference in it are the ledger's (the same as the provider's)."""
    order = fresh_order(world, [("kettle-01", 4500)])
    task = refund_task(order.order_id, "kettle-01", name="honest")
    async with running_worker(client, settings):
        result = await run(client, settings, task)
    assert result.state == "completed"
    refunds = world.refunds(order.order_id)
    rows = [e for e in world.effects(task.task_id) if e["tool"] == "issue_refund"]
    assert [(r["id"], r["amount_cents"]) for r in refunds] == [(rows[0]["provider_ref"], rows[0]["amount_cents"])]
    [message] = world.messages(task.task_id)
    text, (status, named) = split_statement(message["body"])
    assert money_in_text(text) == []
    assert status == "issued" and named == [{"item_id": "kettle-01", "amount_cents": 4500, "currency": "usd",
                                             "provider_ref": refunds[0]["id"]}]


@pytest.mark.parametrize("text", [
    "Your refund has been issued and is on its way.", "We were unable to process your refund of $118.00",
    "your refund has not been issued", "You'll get 118 back", "118.00 USD", "one hundred eighteen dollars",
    "The money is on its way back to your card.", "R E F U N D done", "Ｒｅｆｕｎｄ sent", "credited to you",
    "We reimbursed you", "Payment sent", "No charge was made", "reference re_3Nabcdef", "€45", "45 EUR",
    "It was processed.", "Your account was settled.",
])
def test_free_text_with_money_facts_is_caught(text: str):
    assert money_in_text(text), text


@pytest.mark.parametrize("text", [
    "We are sorry your order arrived damaged.", "Ticket SU-88421-r7 about oak-shelf-4: a courier will collect it.",
    "The customer reported an item of this order arrived damaged; a courier will collect it.",
    "Sorry for the issue with your order.",
])
def test_free_text_without_money_facts_passes(text: str):
    assert money_in_text(text) == [], text



# --- a payee's remittance email: the same rule, for payments -------------------------------------


def email(about: str, body: str, **fields) -> dict:
    return {"name": "send_email", "arguments": json.dumps(
        {"to": "ap@acme.example", "subject": f"{about} from Sundry", "body": body, **fields})}


async def test_a_remittance_email_states_the_payment_only_as_the_records_show_it(client: Client,
                                                                                settings: Settings, world: World):
    """Before the payment: "paid" is refused (the records show not_paid); an amount in the free text or
    a money word in the subject is refused; after it, "not_paid" is refused and the honest email is sent
    with the product's sentence naming the provider's payment."""
    invoice = Invoice(invoice_id=f"INV-{uuid.uuid4().hex[:6]}", payee="ACME", payee_email="ap@acme.example",
                      amount_cents=42000)
    seed_invoice(world.records, world.gateway, invoice)
    iid = invoice.invoice_id
    pay = {"name": "send_payment", "arguments": json.dumps(
        {"invoice_id": iid, "payee": "ACME", "amount_cents": 42000, "currency": "usd"})}
    calls = [
        email(iid, "Thank you.", payment_status="paid", invoice_id=iid),
        email(iid, "We sent 420.00 today."),
        {"name": "send_email", "arguments": json.dumps({"to": "ap@acme.example", "subject": "Payment sent",
                                                         "body": "Thank you."})},
        pay,
        email(iid, "Thank you for your work.", payment_status="not_paid", invoice_id=iid),
        email(iid, "Thank you for your work!", payment_status="paid", invoice_id=iid),
    ]
    task = TaskInput(task_id=f"invoice-{iid}-{uuid.uuid4().hex[:6]}", scenario="INV-9",
                     kind=TaskKind.SUPPLIER_PAYMENT, facts={"invoice_id": iid},
                     brief=f"Accounts payable: invoice {iid} from ACME is approved. Pay it and email the remittance.",
                     model_options={"script_calls": calls})
    async with running_worker(client, settings):
        result = await run(client, settings, task)
    reasons = [s.reason for s in result.checkpoint.steps.values() if s.tool == "send_email"]
    assert reasons == ["false_money_claim", "money_in_free_text", "money_in_free_text", "false_money_claim", None]
    [payment] = world.payments(iid)
    [sent] = world.messages(result.checkpoint.task_id)
    text, statement = split_payment_statement(sent["body"])
    assert text == "Thank you for your work!"
    assert statement == ("paid", [Paid(42000, "usd", payment["id"])])


@pytest.mark.parametrize("began_before_the_fold", [False, True])
async def test_a_message_whose_money_status_changed_is_sent_again_with_the_same_words(
        client: Client, settings: Settings, world: World, began_before_the_fold: bool):
    """The customer is told no refund was issued; the refund is then made, and the model tells them so in the
    same words with refund_status issued. That is another message (its money status is part of its intent),
    not the first one answered already_performed: the customer gets both, the second naming the refund.
    A task begun before that change (a redrive of one says so in its input) keeps the keys it began with
    for its life: the second message is the first one's, answered already_performed, never sent twice."""
    order = fresh_order(world, [("kettle", 4500)])
    oid = order.order_id
    words = "Thank you for your patience."
    task = script(oid, "kettle", [notify(oid, words, refund_status="not_issued", item_id="kettle"),
                                  refund_call(oid, "kettle", 4500),
                                  notify(oid, words, refund_status="issued", item_id="kettle")], name="told-twice")
    if began_before_the_fold:
        task = task.model_copy(update={"status_in_message_keys": False})
    async with running_worker(client, settings):
        result = await run(client, settings, task)
    [refund] = world.refunds(oid)
    bodies = [m["body"] for m in world.messages(task.task_id)]
    steps = [s for s in result.checkpoint.steps.values() if s.tool == "notify_customer"]
    assert result.state == "completed" and result.checkpoint.status_in_message_keys is not began_before_the_fold
    if began_before_the_fold:
        assert [split_statement(b)[1][0] for b in bodies] == ["not_issued"], bodies
        assert [s.outcome for s in steps] == [Outcome.ALREADY_PERFORMED], "one intent, answered from the journal"
        return
    assert [split_statement(b)[1][0] for b in bodies] == ["not_issued", "issued"], bodies
    assert refund["id"] in bodies[1]
    assert [s.outcome for s in steps] == [Outcome.PERFORMED, Outcome.PERFORMED]


async def test_a_message_asked_for_too_often_without_success_can_be_rejected(client: Client, settings: Settings,
                                                                            world: World):
    """The model keeps telling the customer a refund was issued that never was: each is refused, and past the
    task's asks a person decides before the message runs again. Nothing was sent, so `reject` is offered
    (it is withheld only for a call that ran out of attempts with its outcome in doubt) and is kept."""
    from tests.approvers import signed

    order = fresh_order(world, [("kettle", 4500)])
    oid = order.order_id
    lie = notify(oid, "Your refund is on its way.", refund_status="issued", item_id="kettle")
    task = script(oid, "kettle", [lie, lie, lie], name="told-too-often").model_copy(update={"max_asks_per_call": 2})
    async with running_worker(client, settings):
        handle = await start(client, settings, task)
        asked = await waiting(handle)
        assert asked.waiting_for.reason == "attempts_exhausted" and not asked.waiting_for.ran, asked.waiting_for
        assert "reject" in asked.waiting_for.allowed, asked.waiting_for.allowed
        await handle.signal("resolve", signed(handle.id, asked.waiting_for.intent_key, "reject"))
        result = await finished(handle)
    assert result.state == "completed" and [d.status for d in result.checkpoint.decisions] == ["applied"]
    assert world.messages(task.task_id) == [] and world.refunds(oid) == []
