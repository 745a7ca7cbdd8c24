"""Scope per item, invoice, payee and recipient (issue 22, item 4): a ticket's facts bind the item
as well as the order, wherever they name one. A refund of another item of the same order is
refused by the gate as out_of_scope, before any activity runs: nothing at the provider, no ledger
row. Judged on the provider's refunds, the ledger and the checkpoint."""

from __future__ import annotations

import pytest
from temporalio.client import Client

from activities.world import World
from core.authority import out_of_scope
from core.keys import derive_intent_key
from core.kinds import KINDS, fact_values
from core.models import Outcome, Policy, TaskKind
from core.tools import REGISTRY
from infra.settings import Settings
from tests.helpers import run, running_worker
from tests.test_money_boundary import fresh_order, refund_call, scripted


def _policy(kind: TaskKind, parties: tuple[str, ...] = ()) -> Policy:
    return Policy(kind=kind, tools=list(KINDS[kind].tools), approvers=[], refund_ceiling_cents=15000,
                  payment_ceiling_cents=None, escalation_timeout_seconds=60, parties=list(parties))


def _refund(item_id: str, order_id: str = "ORD-8841") -> dict:
    return {"order_id": order_id, "item_id": item_id, "amount_cents": 100, "currency": "usd", "reason": "x"}


# --- out_of_scope, pure ------------------------------------------------------------------------

@pytest.mark.parametrize("kind", [TaskKind.REFUND_TICKET, TaskKind.REFUND_REQUEST])
def test_an_item_the_facts_name_binds_refunds_and_pickups(kind: TaskKind):
    facts = {"order_id": "ORD-8841", "item_id": "kettle-01"}
    policy = _policy(kind)
    assert out_of_scope("issue_refund", _refund("kettle-01"), facts, policy) is None
    why = out_of_scope("issue_refund", _refund("mugs-02"), facts, policy)
    assert why is not None and "'mugs-02'" in why and "kettle-01" in why and "escalate_to_human" in why
    assert out_of_scope("issue_refund", _refund("kettle-01,mugs-02"), facts, policy) is not None
    assert out_of_scope("issue_refund", _refund("KETTLE-01"), facts, policy) is not None, "ids compare exactly"
    assert out_of_scope("issue_refund", _refund("kettle-01", "ORD-1"), facts, policy) is not None
    # as before items were bound, for histories recorded then: the order alone
    assert out_of_scope("issue_refund", _refund("mugs-02"), facts, policy, narrowed=False) is None
    assert out_of_scope("issue_refund", _refund("mugs-02", "ORD-1"), facts, policy, narrowed=False) is not None
    # the tools that name no item stay bound by the order alone
    assert out_of_scope("get_order", {"order_id": "ORD-8841"}, facts, policy) is None
    assert out_of_scope("notify_customer", {"order_id": "ORD-8841", "message": "hi"}, facts, policy) is None


def test_pickups_are_bound_to_the_items_named_too():
    facts = {"order_id": "ORD-8841", "item_id": "kettle-01"}
    for kind, tool in ((TaskKind.REFUND_TICKET, "schedule_pickup"), (TaskKind.RETURN_PICKUP, "book_courier")):
        policy = _policy(kind)
        assert out_of_scope(tool, {"order_id": "ORD-8841", "item_id": "kettle-01"}, facts, policy) is None
        assert out_of_scope(tool, {"order_id": "ORD-8841", "item_id": "mugs-02"}, facts, policy) is not None


def test_a_ticket_for_several_items_names_each_and_one_that_names_none_is_bound_by_its_order():
    policy = _policy(TaskKind.REFUND_TICKET)
    two = {"order_id": "ORD-8841", "item_id": "kettle-01, mugs-02"}
    assert fact_values(two, "item_id") == ("kettle-01", "mugs-02")
    assert out_of_scope("issue_refund", _refund("kettle-01"), two, policy) is None
    assert out_of_scope("issue_refund", _refund("mugs-02"), two, policy) is None
    assert out_of_scope("issue_refund", _refund("tray-03"), two, policy) is not None
    for order_only in ({"order_id": "ORD-8841"}, {"order_id": "ORD-8841", "item_id": ""},
                       {"order_id": "ORD-8841", "item_id": " , "}):
        assert fact_values(order_only, "item_id") == ()
        assert out_of_scope("issue_refund", _refund("mugs-02"), order_only, policy) is None
        assert out_of_scope("issue_refund", _refund("mugs-02", "ORD-1"), order_only, policy) is not None


def test_a_payment_is_bound_to_its_invoice_and_the_payee_and_recipient_the_facts_name():
    policy = _policy(TaskKind.SUPPLIER_PAYMENT, parties=("ap@acme.example", "billing@acme.example"))
    pay = {"invoice_id": "INV-9", "payee": "ACME", "amount_cents": 420000, "currency": "usd"}
    email = {"to": "billing@acme.example", "subject": "Remittance", "body": "paid"}
    invoice_only = {"invoice_id": "INV-9"}
    assert out_of_scope("send_payment", pay, invoice_only, policy) is None
    assert out_of_scope("send_payment", {**pay, "invoice_id": "INV-10"}, invoice_only, policy) is not None
    assert out_of_scope("send_email", email, invoice_only, policy) is None, "any party on record, when none is named"
    assert out_of_scope("send_email", {**email, "to": "x@outside.example"}, invoice_only, policy) is not None

    named = {"invoice_id": "INV-9", "payee": "ACME", "recipient": "AP@acme.example"}
    assert out_of_scope("send_payment", pay, named, policy) is None
    why = out_of_scope("send_payment", {**pay, "payee": "ACME Holdings"}, named, policy)
    assert why is not None and "payee" in why and "'ACME Holdings'" in why
    assert out_of_scope("send_email", {**email, "to": "ap@acme.example"}, named, policy) is None, "without case"
    why = out_of_scope("send_email", email, named, policy)
    assert why is not None and "recipient" in why, "a party on record, but not the recipient the facts name"
    assert out_of_scope("lookup_invoice", {"invoice_id": "INV-9"}, named, policy) is None


def test_the_kinds_declare_what_they_narrow():
    for kind in (TaskKind.REFUND_TICKET, TaskKind.REFUND_REQUEST, TaskKind.RETURN_PICKUP):
        assert KINDS[kind].binds == ("order_id",) and KINDS[kind].narrows == ("item_id",)
    assert KINDS[TaskKind.SUPPLIER_PAYMENT].binds == ("invoice_id",)
    assert KINDS[TaskKind.SUPPLIER_PAYMENT].narrows == ("payee", "to")
    for kind, spec in KINDS.items():  # every narrowed field is an argument of a tool the kind offers
        arguments = {f for t in spec.tools for f in REGISTRY[t].args.model_fields}
        assert set(spec.narrows) <= arguments, kind


# --- end to end ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", [TaskKind.REFUND_TICKET, TaskKind.REFUND_REQUEST])
async def test_a_refund_of_another_item_of_the_order_is_refused_and_nothing_is_paid(
    kind: TaskKind, client: Client, settings: Settings, world: World,
):
    """The ticket's facts name the kettle; the model refunds the mugs of the same order, then the kettle.
    The mugs' call never reaches an activity: the provider holds only the kettle's refund and the
    ledger only its row."""
    order = fresh_order(world, [("kettle-01", 4500), ("mugs-02", 2400)])
    task = scripted(order.order_id, "kettle-01", [refund_call(order.order_id, "mugs-02", 2400),
                                                  refund_call(order.order_id, "kettle-01", 4500)])
    task = task.model_copy(update={"kind": kind})
    assert task.facts == {"order_id": order.order_id, "item_id": "kettle-01"}
    async with running_worker(client, settings):
        result = await run(client, settings, task)

    refunds = world.refunds(order.order_id)
    assert [r for r in refunds if r["item_id"] == "mugs-02"] == []
    assert [(r["item_id"], r["amount_cents"]) for r in refunds] == [("kettle-01", 4500)]

    steps = result.checkpoint.steps
    refused, kettle = steps["issue_refund"], steps["issue_refund#2"]
    assert (refused.status, refused.outcome, refused.reason) == ("rejected", Outcome.NOT_PERFORMED, "out_of_scope")
    assert refused.attempts == 0 and refused.intent_key is None and "mugs-02" in refused.result["message"]
    assert kettle.outcome is Outcome.PERFORMED and kettle.intent_key == refunds[0]["intent_key"]

    spec = REGISTRY["issue_refund"]
    mugs_call = {k: v for k, v in refund_call(order.order_id, "mugs-02", 2400).items() if k != "tool"}
    mugs_key = derive_intent_key(spec.name, spec.key_fields, mugs_call, {"task_id": task.task_id})
    assert world.ledger.get(mugs_key) is None, "no ledger row for the refused item"
    rows = [e for e in world.effects(task.task_id) if e["tool"] == "issue_refund"]
    assert [(e["intent_key"], e["status"]) for e in rows] == [(kettle.intent_key, "performed")]
    assert result.state == "completed"
