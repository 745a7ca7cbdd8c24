"""What a message may say of an order's refund, from the records alone (activities/claims.py): a ticket
with no refund of its own is told about other tickets' refunds of the same order, in flight or landed."""

from __future__ import annotations

import time
from pathlib import Path

from activities.claims import ProviderRefund, refund_truth
from activities.db import Database
from activities.ledger import Claimed, EffectLedger, Hold, Request, item_resource, order_resource
from core.domain import Item, Order

ORDER = Order(order_id="ORD-7", customer_name="Ada", customer_email="ada@example.com", seller="Oak & Co",
              seller_email="oak@example.com", items=[Item(item_id="oak", description="oak unit", amount_cents=11800),
                                                     Item(item_id="lamp", description="lamp", amount_cents=2500)])


def ledger(tmp_path: Path) -> tuple[Database, EffectLedger]:
    db = Database(tmp_path / "agent.db")
    db.create()
    return db, EffectLedger(db)


def claim(ledger: EffectLedger, task_id: str, item_id: str, amount: int) -> Claimed:
    now = time.time()
    claimed = ledger.claim(Request(
        intent_key=f"k-{task_id}-{item_id}", task_id=task_id, tool="issue_refund",
        arguments={"order_id": ORDER.order_id, "item_id": item_id, "amount_cents": amount},
        owner=f"{task_id}/run/4", attempt=1, amount_cents=amount,
        holds=(Hold(item_resource(ORDER.order_id, item_id), amount, amount),
               Hold(order_resource(ORDER.order_id), ORDER.paid_cents, amount)),
        lease_until=now + 30, horizon=now + 60))
    assert isinstance(claimed, Claimed)
    return claimed


def landed(task_id: str, item_id: str, amount: int) -> ProviderRefund:
    return ProviderRefund("re_A", amount, "succeeded", task_id, item_id, f"k-{task_id}-{item_id}")


def test_a_ticket_with_no_refund_of_its_own_is_not_told_none_was_issued_while_another_is_in_flight(tmp_path: Path):
    db, effects = ledger(tmp_path)
    claim(effects, "ticket-A", "oak", 11800)  # its request may be on its way to the provider
    for item_id in ("oak", None):
        truth = refund_truth(db, "ticket-B", ORDER, item_id, [])
        assert truth.status == "pending_review", (item_id, truth.detail)
        assert "ticket-A: intent" in truth.detail
    assert refund_truth(db, "ticket-B", ORDER, "lamp", []).status == "not_issued", "another item is not in scope"


def test_a_ticket_with_no_refund_of_its_own_is_told_of_the_orders_earlier_refund(tmp_path: Path):
    db, effects = ledger(tmp_path)
    held = claim(effects, "ticket-A", "oak", 11800)
    assert effects.performed(held.effect, "re_A", 11800, {})
    provider = [landed("ticket-A", "oak", 11800)]
    for item_id in ("oak", None):  # the item, or the whole order
        truth = refund_truth(db, "ticket-B", ORDER, item_id, provider)
        assert truth.status == "issued", (item_id, truth.detail)
        assert [(r.item_id, r.amount_cents, r.provider_ref) for r in truth.effects] == [("oak", 11800, "re_A")]
    assert refund_truth(db, "ticket-B", ORDER, "lamp", provider).status == "not_issued"
