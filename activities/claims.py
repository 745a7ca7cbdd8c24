"""What the records say of a task's refunds, for the money claims of its messages to people.

A message tool's `refund_status` is checked here against the ledger rows of the task's issue_refund
intents for the order (and item), and against the provider's own refunds of the order that name the
task. The product then writes the money sentence from these records (core/claims.py), never from the
model's words.

    issued          every live intent in scope is performed, with a provider reference and amount the
                    provider holds, and there is at least one; or, with none of the task's own, the
                    provider holds refunds of the named item made before (a second ticket's refund
                    answered already_performed is the earlier one)
    pending_review  an intent in scope is in flight or in doubt (`intent`, `unknown`): a request may
                    have landed, or a person decides. (A refund that waits for a human's approval
                    holds the task's gate: no message of the task runs until it is decided.)
                    With no intent of the task in scope, refunds the provider holds naming the task are
                    issued: the provider is the record of money moved.
    not_issued      no intent in scope is live, no other task's refund of the order (item) is in flight or
                    in doubt, and the provider holds no refund of the order (item)

    With no intent of the task in scope, another task's refund of the order (item) decides: issued when
    the provider holds it, pending_review while it is in flight or in doubt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from activities.db import Database
from activities.effects import PROVIDER_ERRORS, describe
from activities.ledger import item_resource, order_resource
from activities.payments import StripeGateway, intent_key_of, metadata_of
from activities.records import InvoiceRecord, OrderRecord
from core.claims import Paid, PaymentStatus, Refunded, RefundStatus
from core.domain import Order

__all__ = ["PaymentTruth", "ProviderRefund", "RefundTruth", "Truth", "payment_records", "refund_records",
           "refund_truth"]

_S = TypeVar("_S", bound=str)
_E = TypeVar("_E", Refunded, Paid)


@dataclass(frozen=True)
class ProviderRefund:
    ref: str
    amount_cents: int
    status: str
    task_id: str | None
    item_id: str | None
    intent_key: str | None


@dataclass
class Truth(Generic[_S, _E]):
    """What the records show for a task's money claim (its refunds of an order or an item, its payment
    of an invoice): a status, or None when they show no one status; the effects they hold for it."""

    status: _S | None
    detail: str
    effects: list[_E] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    unreadable: bool = False

    def allows(self, claim: _S) -> bool:
        return self.status == claim


RefundTruth = Truth[RefundStatus, Refunded]
PaymentTruth = Truth[PaymentStatus, Paid]


def _ledger_rows(db: Database, task_id: str, tool: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The task's ledger rows of one tool, oldest first, each with its call's arguments."""
    with db.connect() as conn:
        found = conn.execute(
            "SELECT intent_key, status, provider_ref, amount_cents, arguments FROM effects"
            " WHERE task_id = :task AND tool = :tool ORDER BY created_at", {"task": task_id, "tool": tool}).fetchall()
    return [({"intent_key": r["intent_key"], "status": r["status"], "provider_ref": r["provider_ref"],
              "amount_cents": r["amount_cents"]}, json.loads(r["arguments"] or "{}")) for r in found]


def _not_held(shown: str, performed: list[dict[str, Any]], held_cents: dict[str, int]) -> str | None:
    """Why the ledger's performed rows are not what the provider holds (its amount by reference), or None."""
    missing = [r for r in performed if r["provider_ref"] not in held_cents
               or held_cents[r["provider_ref"]] != r["amount_cents"]]
    if not missing:
        return None
    return (f"the ledger holds {shown}, but the provider does not hold "
            f"{', '.join(str(r['provider_ref']) for r in missing)} as recorded")


def _unreadable(what: str, err: Exception) -> Truth[Any, Any]:
    return Truth(None, f"the provider's {what} cannot be read now ({describe(err)})", unreadable=True)


def refund_truth(db: Database, task_id: str, order: Order, item_id: str | None,
                 provider: list[ProviderRefund]) -> RefundTruth:
    """The task's refunds of the order (or of one item) as the ledger and the provider hold them."""
    order_id, currency = order.order_id, order.currency
    rows = [{**row, "item_id": arguments.get("item_id")} for row, arguments in _ledger_rows(db, task_id, "issue_refund")
            if arguments.get("order_id") == order_id and (item_id is None or arguments.get("item_id") == item_id)]
    landed = {p.ref: p for p in provider if p.status in ("succeeded", "pending") and p.task_id == task_id
              and (item_id is None or p.item_id == item_id)}
    performed = [r for r in rows if r["status"] == "performed"]
    pending = [r for r in rows if r["status"] in ("intent", "unknown")]
    shown = "; ".join(f"{r['item_id']}: {r['status']}"
                      + (f" {r['amount_cents'] / 100:.2f} {currency.upper()} as {r['provider_ref']}"
                         if r["status"] == "performed" else "") for r in rows) or "no refund intent of this task"
    not_held = _not_held(shown, performed, {ref: p.amount_cents for ref, p in landed.items()})
    unexplained = [p for ref, p in landed.items() if ref not in {r["provider_ref"] for r in performed}]
    if not_held:
        return RefundTruth(None, not_held, rows=rows)
    if unexplained and not rows:  # no intent of the task in scope: the provider's records are all there is
        refunded = [Refunded(p.item_id, p.amount_cents, currency, p.ref) for p in unexplained]
        return RefundTruth("issued", f"the ledger holds no refund intent of this task; the provider holds "
                                     f"{', '.join(p.ref for p in unexplained)} naming it", refunded, rows)
    if pending or unexplained:
        if performed:
            return RefundTruth(None, f"the ledger holds {shown}: some performed, some in flight or in doubt; "
                                     f"name the item", rows=rows)
        extra = f"; the provider holds {', '.join(p.ref for p in unexplained)}" if unexplained else ""
        return RefundTruth("pending_review", f"the ledger holds {shown}{extra}", rows=rows)
    if performed:
        refunded = [Refunded(r["item_id"], r["amount_cents"], currency, r["provider_ref"]) for r in performed]
        return RefundTruth("issued", f"the ledger and the provider hold {shown}", refunded, rows)
    scope = item_id or f"order {order_id}"
    others = _in_flight_elsewhere(db, task_id, order_id, item_id)
    if others:  # another ticket's refund of it may land any moment, or a person decides it
        return RefundTruth("pending_review", f"the ledger holds {shown}; another task's refund of {scope} is in "
                                             f"flight or in doubt ({', '.join(others)})", rows=rows)
    earlier = [p for p in provider
               if p.status in ("succeeded", "pending") and (item_id is None or p.item_id == item_id)]
    if earlier:  # refunded before this task (another ticket): its call was answered already_performed
        refunded = [Refunded(p.item_id, p.amount_cents, currency, p.ref) for p in earlier]
        return RefundTruth("issued", f"the provider holds {', '.join(p.ref for p in earlier)} for {scope}, "
                                     f"refunded before this task", refunded, rows)
    return RefundTruth("not_issued", f"the ledger holds {shown} and the provider holds no refund of {scope}",
                       rows=rows)


def _in_flight_elsewhere(db: Database, task_id: str, order_id: str, item_id: str | None) -> list[str]:
    """Other tasks' refund intents on the order (or the item) that are in flight or in doubt: what the
    provider does not show yet may land, so nobody may be told there is no refund."""
    resource = item_resource(order_id, item_id) if item_id else order_resource(order_id)
    with db.connect() as conn:
        found = conn.execute(
            "SELECT e.task_id, e.status FROM holds h JOIN effects e ON e.intent_key = h.intent_key"
            " WHERE h.resource = :resource AND e.tool = 'issue_refund' AND e.task_id != :task"
            " AND e.status IN ('intent', 'unknown') ORDER BY e.created_at",
            {"resource": resource, "task": task_id}).fetchall()
    return [f"{r['task_id']}: {r['status']}" for r in found]


def refund_records(db: Database, gateway: StripeGateway, task_id: str, record: OrderRecord,
                   item_id: str | None) -> RefundTruth:
    """`refund_truth` with the provider's refunds of the order read now; `unreadable` when they cannot be."""
    try:
        provider = [ProviderRefund(r.id, r.amount, r.status, metadata_of(r).get("task_id"),
                                   metadata_of(r).get("item_id"), intent_key_of(r))
                    for r in gateway.refunds(record.payment_intent_id)]
    except PROVIDER_ERRORS as err:
        return _unreadable("refunds", err)
    return refund_truth(db, task_id, record.order, item_id, provider)


def payment_records(db: Database, gateway: StripeGateway, task_id: str, record: InvoiceRecord) -> PaymentTruth:
    """The invoice's payment as the task's ledger rows and the provider's payments to its payee hold it.

        paid            every live intent of the task is performed with a payment the provider holds; or,
                        with none of the task's own, the provider holds a payment of the invoice (made before)
        pending_review  an intent of the task is in flight or in doubt
        not_paid        none of that
    """
    invoice = record.invoice
    rows = [row for row, arguments in _ledger_rows(db, task_id, "send_payment")
            if arguments.get("invoice_id") == invoice.invoice_id]
    try:
        held = {p.id: p for p in gateway.payments_to(record.customer_ref)
                if metadata_of(p).get("invoice_id") == invoice.invoice_id and p.status == "succeeded"}
    except PROVIDER_ERRORS as err:
        return _unreadable("payments", err)
    shown = "; ".join(f"{r['status']}" + (f" {r['amount_cents'] / 100:.2f} as {r['provider_ref']}"
                                          if r["status"] == "performed" else "") for r in rows) or "no payment intent"
    performed = [r for r in rows if r["status"] == "performed"]
    not_held = _not_held(shown, performed, {ref: p.amount for ref, p in held.items()})
    if not_held:
        return PaymentTruth(None, not_held, rows=rows)
    if any(r["status"] in ("intent", "unknown") for r in rows):
        return PaymentTruth("pending_review", f"the ledger holds {shown} of this task", rows=rows)
    currency = invoice.currency
    if performed:
        return PaymentTruth("paid", f"the ledger and the provider hold {shown}",
                            [Paid(r["amount_cents"], currency, r["provider_ref"]) for r in performed], rows)
    if held:
        return PaymentTruth("paid", f"the provider holds {', '.join(held)} for invoice {invoice.invoice_id}",
                            [Paid(p.amount, currency, p.id) for p in held.values()], rows)
    return PaymentTruth("not_paid", f"the ledger holds {shown} of this task and the provider no payment of "
                                    f"invoice {invoice.invoice_id}", rows=rows)
