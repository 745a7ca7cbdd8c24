"""Tool activities. All I/O lives here; each tool answers with one of the four outcomes."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import timedelta
from typing import Any, Callable

import stripe
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.db import Database
from activities.faults import crash_point
from activities.ledger import Claim, EffectLedger
from activities.payments import StripeGateway
from activities.records import Records, send_once, upsert_confirmation
from core.models import Outcome, ToolInput, ToolResult
from core.tools import (
    GetOrderArgs,
    IssueRefundArgs,
    LookupInvoiceArgs,
    MessageSellerArgs,
    NotifyCustomerArgs,
    SchedulePickupArgs,
    SearchPolicyArgs,
    SendEmailArgs,
    SendPaymentArgs,
    WriteConfirmationArgs,
)

POLICY = {
    "damaged": "Items that arrive damaged are refunded in full to the original payment method; "
               "the seller is told and a courier collects the item.",
    "approval": "Refunds above the approval ceiling need a human approval before they are sent.",
    "invoice": "Approved supplier invoices are paid in full, once, and the supplier gets a remittance email.",
}

_AMBIGUOUS = (stripe.APIConnectionError, stripe.APIError)


class ToolActivities:
    """Holds the stores and the payment gateway; one method per tool, registered by tool name."""

    def __init__(self, db: Database, gateway: StripeGateway, approval_ceiling_cents: int,
                 lease_seconds: float = 15.0) -> None:
        self._db = db
        self._ledger = EffectLedger(db)
        self._records = Records(db)
        self._gateway = gateway
        self._ceiling = approval_ceiling_cents
        self._lease = lease_seconds

    def activities(self) -> list[Callable]:
        return [self.get_order, self.search_policy, self.lookup_invoice, self.issue_refund,
                self.write_confirmation, self.notify_customer, self.message_seller, self.schedule_pickup,
                self.send_payment, self.send_email]

    # --- reads -------------------------------------------------------------------------

    @activity.defn(name="get_order")
    async def get_order(self, call: ToolInput) -> ToolResult:
        return await _in_thread(self._get_order, call)

    def _get_order(self, call: ToolInput) -> ToolResult:
        args = GetOrderArgs.model_validate(call.arguments)
        record = self._records.order(args.order_id)
        if record is None:
            return _read_error(call, "unknown_order", f"no order {args.order_id}")
        refunded = self._gateway.refunded_cents(record.payment_intent_id)
        order = record.order
        return ToolResult(tool=call.tool, attempt=_attempt(), data={
            **order.model_dump(), "paid_cents": order.paid_cents, "refunded_cents": refunded,
            "refundable_cents": order.paid_cents - refunded, "approval_ceiling_cents": self._ceiling})

    @activity.defn(name="search_policy")
    async def search_policy(self, call: ToolInput) -> ToolResult:
        args = SearchPolicyArgs.model_validate(call.arguments)
        words = set(args.query.lower().split())
        hits = [text for topic, text in POLICY.items() if topic in words or any(w in text.lower() for w in words)]
        return ToolResult(tool=call.tool, attempt=_attempt(), data={"passages": hits or list(POLICY.values())})

    @activity.defn(name="lookup_invoice")
    async def lookup_invoice(self, call: ToolInput) -> ToolResult:
        return await _in_thread(self._lookup_invoice, call)

    def _lookup_invoice(self, call: ToolInput) -> ToolResult:
        args = LookupInvoiceArgs.model_validate(call.arguments)
        record = self._records.invoice(args.invoice_id)
        if record is None:
            return _read_error(call, "unknown_invoice", f"no invoice {args.invoice_id}")
        return ToolResult(tool=call.tool, attempt=_attempt(), data=record.invoice.model_dump())

    # --- money -------------------------------------------------------------------------

    @activity.defn(name="issue_refund")
    async def issue_refund(self, call: ToolInput) -> ToolResult:
        return await _in_thread(self._issue_refund, call)

    def _issue_refund(self, call: ToolInput) -> ToolResult:
        args = IssueRefundArgs.model_validate(call.arguments)
        key = _require_key(call)
        record = self._records.order(args.order_id)
        if record is None:
            return _not_performed(call, "unknown_order", f"no order {args.order_id}")
        order, pi = record.order, record.payment_intent_id
        item = next((i for i in order.items if i.item_id == args.item_id), None)
        if item is None:
            return _not_performed(call, "unknown_item", f"order {order.order_id} has no item {args.item_id}")
        if args.currency != order.currency:
            return _not_performed(call, "currency_mismatch", f"order is in {order.currency}, not {args.currency}")
        if args.amount_cents > item.amount_cents:
            return _not_performed(call, "exceeds_item_price", f"item {item.item_id} cost {item.amount_cents} cents")

        claim = self._ledger.claim(key, call.task_id, call.tool, call.arguments, _owner(), self._lease)
        settled = self._settled_or_verified(call, claim, lambda: self._gateway.find_refund(pi, key))
        if settled is not None:
            return settled

        try:
            refunded = self._gateway.refunded_cents(pi)
        except stripe.StripeError as err:
            return self._definitely_not(call, "provider_unavailable", f"could not read refunds: {err}", True)
        if args.amount_cents > order.paid_cents - refunded:
            return self._definitely_not(call, "exceeds_refundable",
                                        f"paid {order.paid_cents}, already refunded {refunded} cents", False)
        approved = call.approval is not None and call.approval.intent_key == key
        if args.amount_cents > self._ceiling and not approved:
            return self._definitely_not(call, "approval_required",
                                        f"{args.amount_cents} cents is over the {self._ceiling} cents ceiling", False)

        self._still_mine(call)
        crash_point("issue_refund:before_provider")
        metadata = {"task_id": call.task_id, "order_id": order.order_id, "item_id": item.item_id}
        if approved:
            metadata["approved_by"] = call.approval.decided_by
        try:
            refund = self._gateway.refund(pi, args.amount_cents, key, metadata)
        except _AMBIGUOUS as err:
            return self._verify_after(call, describe(err), lambda: self._gateway.find_refund(pi, key))
        except stripe.StripeError as err:
            return self._definitely_not(call, "provider_rejected", str(err.user_message or err), False)
        crash_point("issue_refund:after_provider")
        return self._performed(call, refund.id, args.amount_cents, {"status": refund.status})

    @activity.defn(name="send_payment")
    async def send_payment(self, call: ToolInput) -> ToolResult:
        return await _in_thread(self._send_payment, call)

    def _send_payment(self, call: ToolInput) -> ToolResult:
        args = SendPaymentArgs.model_validate(call.arguments)
        key = _require_key(call)
        record = self._records.invoice(args.invoice_id)
        if record is None:
            return _not_performed(call, "unknown_invoice", f"no invoice {args.invoice_id}")
        invoice, payee_ref = record.invoice, record.customer_ref
        if args.payee != invoice.payee:
            return _not_performed(call, "payee_mismatch", f"invoice {invoice.invoice_id} is payable to {invoice.payee}")
        if args.currency != invoice.currency:
            return _not_performed(call, "currency_mismatch", f"invoice is in {invoice.currency}")
        if args.amount_cents != invoice.amount_cents:
            return _not_performed(call, "amount_mismatch", f"invoice amount is {invoice.amount_cents} cents")

        claim = self._ledger.claim(key, call.task_id, call.tool, call.arguments, _owner(), self._lease)
        settled = self._settled_or_verified(call, claim, lambda: self._gateway.find_payment(payee_ref, key))
        if settled is not None:
            return settled

        self._still_mine(call)
        crash_point("send_payment:before_provider")
        metadata = {"task_id": call.task_id, "invoice_id": invoice.invoice_id, "intent_key": key}
        try:
            payment = self._gateway.charge(payee_ref, args.amount_cents, args.currency, metadata, key)
        except _AMBIGUOUS as err:
            return self._verify_after(call, describe(err), lambda: self._gateway.find_payment(payee_ref, key))
        except stripe.StripeError as err:
            return self._definitely_not(call, "provider_rejected", str(err.user_message or err), False)
        crash_point("send_payment:after_provider")
        return self._performed(call, payment.id, args.amount_cents, {"status": payment.status})

    def _settled_or_verified(self, call: ToolInput, claim: Claim, lookup: Callable[[], Any]) -> ToolResult | None:
        """Answer from the ledger, or, when an earlier attempt may have reached the provider, from it."""
        effect = claim.effect
        if effect.status == "performed":
            outcome = Outcome.PERFORMED if _same_call(effect.owner, _owner()) else Outcome.ALREADY_PERFORMED
            return ToolResult(tool=call.tool, outcome=outcome, intent_key=effect.intent_key, attempt=_attempt(),
                              data={"provider_ref": effect.provider_ref, "amount_cents": effect.amount_cents,
                                    "source": "ledger", **effect.detail})
        if claim.fresh:
            return None
        found = self._lookup(call, lookup, f"an earlier attempt left the intent at {claim.previous_status}")
        if isinstance(found, ToolResult):
            return found
        if found is not None:
            result = self._performed(call, found.id, found.amount, {"status": found.status, "verified_by": "lookup"})
            if not _same_call(claim.previous_owner, _owner()):
                result.outcome = Outcome.ALREADY_PERFORMED  # an earlier run or ask did it, not this call
            return result
        if effect.owner != _owner():
            # Another attempt (perhaps of this very call, on a worker that is paused, not dead) holds
            # a live lease and may still send: wait for the lease, then verify again.
            return self._give_up_or_retry(call, "in_flight", "another attempt holds this intent and may be sending it",
                                          wait=max(0.5, effect.lease_until - time.time()))
        return None

    def _still_mine(self, call: ToolInput) -> None:
        """Fencing, just before the provider call: an attempt whose lease was taken over must not send."""
        effect = self._ledger.get(call.intent_key)
        if effect is None or effect.owner != _owner() or effect.status != "intent":
            raise ApplicationError(f"intent {call.intent_key} is now held by {effect.owner if effect else 'nobody'};"
                                   " this attempt lost its lease and does not send", type="LeaseLost",
                                   non_retryable=True)

    def _verify_after(self, call: ToolInput, error: str, lookup: Callable[[], Any]) -> ToolResult:
        """After an ambiguous send: ask the provider, never guess."""
        found = self._lookup(call, lookup, error)
        if isinstance(found, ToolResult):
            return found
        if found is not None:
            return self._performed(call, found.id, found.amount,
                                   {"status": found.status, "verified_by": "lookup", "after": error})
        return self._definitely_not(call, "provider_error", f"{error}; the provider has no record of it", True)

    def _lookup(self, call: ToolInput, lookup: Callable[[], Any], why: str) -> Any:
        """The provider's record of this intent, None if it has none, or the answer when it cannot say."""
        try:
            return lookup()
        except stripe.StripeError as err:
            return self._give_up_or_retry(call, "unverifiable", f"{why}; the lookup failed: {describe(err)}")

    def _give_up_or_retry(self, call: ToolInput, reason: str, message: str, wait: float | None = None) -> ToolResult:
        """Let Temporal retry (the next attempt verifies first); on the last attempt, answer unknown."""
        info = activity.info()
        limit = info.retry_policy.maximum_attempts if info.retry_policy else 1
        if limit and info.attempt >= limit:
            self._ledger.unknown(call.intent_key, {"reason": reason, "message": message})
            return ToolResult(tool=call.tool, outcome=Outcome.UNKNOWN, intent_key=call.intent_key, reason=reason,
                              message=f"{message}. It may have happened: do not retry; a human must check.",
                              retryable=False, attempt=info.attempt)
        if wait is None:
            self._ledger.release(call.intent_key, _owner())  # this attempt will not send: no need to wait for it
        raise ApplicationError(message, type="OutcomeUnverified",
                               next_retry_delay=timedelta(seconds=wait) if wait else None)

    def _performed(self, call: ToolInput, ref: str, amount: int, detail: dict[str, Any]) -> ToolResult:
        self._ledger.performed(call.intent_key, ref, amount, detail)
        return ToolResult(tool=call.tool, outcome=Outcome.PERFORMED, intent_key=call.intent_key, attempt=_attempt(),
                          data={"provider_ref": ref, "amount_cents": amount, **detail})

    def _definitely_not(self, call: ToolInput, reason: str, message: str, retryable: bool) -> ToolResult:
        self._ledger.not_performed(call.intent_key, {"reason": reason, "message": message})
        return _not_performed(call, reason, message, retryable)

    # --- writes to people and records --------------------------------------------------

    @activity.defn(name="write_confirmation")
    async def write_confirmation(self, call: ToolInput) -> ToolResult:
        args = WriteConfirmationArgs.model_validate(call.arguments)
        record = await self._order(args.order_id)
        if record is None:
            return _not_performed(call, "unknown_order", f"no order {args.order_id}")
        await _in_thread(upsert_confirmation, self._db, call.task_id, args.order_id, args.text)
        return ToolResult(tool=call.tool, outcome=Outcome.PERFORMED, intent_key=call.intent_key, attempt=_attempt(),
                          data={"order_id": args.order_id})

    @activity.defn(name="notify_customer")
    async def notify_customer(self, call: ToolInput) -> ToolResult:
        args = NotifyCustomerArgs.model_validate(call.arguments)
        record = await self._order(args.order_id)
        if record is None:
            return _not_performed(call, "unknown_order", f"no order {args.order_id}")
        return await self._send(call, "email", record.order.customer_email, f"Your order {args.order_id}",
                                args.message)

    @activity.defn(name="message_seller")
    async def message_seller(self, call: ToolInput) -> ToolResult:
        args = MessageSellerArgs.model_validate(call.arguments)
        record = await self._order(args.order_id)
        if record is None:
            return _not_performed(call, "unknown_order", f"no order {args.order_id}")
        return await self._send(call, "seller_message", record.order.seller_email, f"Order {args.order_id}",
                                args.message)

    @activity.defn(name="schedule_pickup")
    async def schedule_pickup(self, call: ToolInput) -> ToolResult:
        args = SchedulePickupArgs.model_validate(call.arguments)
        record = await self._order(args.order_id)
        if record is None or not any(i.item_id == args.item_id for i in record.order.items):
            return _not_performed(call, "unknown_item", f"order {args.order_id} has no item {args.item_id}")
        return await self._send(call, "pickup", "courier", f"Pickup {args.order_id}/{args.item_id}",
                                f"Collect {args.item_id} from {record.order.customer_name}")

    async def _order(self, order_id: str):  # noqa: ANN202
        return await _in_thread(self._records.order, order_id)

    @activity.defn(name="send_email")
    async def send_email(self, call: ToolInput) -> ToolResult:
        args = SendEmailArgs.model_validate(call.arguments)
        return await self._send(call, "email", args.to, args.subject, args.body)

    async def _send(self, call: ToolInput, kind: str, recipient: str, subject: str, body: str) -> ToolResult:
        key = _require_key(call)
        sent_now, mine = await _in_thread(send_once, self._db, key, call.task_id, call.tool, call.arguments,
                                          _owner().split("#")[0], kind, recipient, subject, body)
        crash_point(f"{call.tool}:after_send")
        outcome = Outcome.PERFORMED if (sent_now or mine) else Outcome.ALREADY_PERFORMED
        return ToolResult(tool=call.tool, outcome=outcome, intent_key=key, attempt=_attempt(),
                          data={"recipient": recipient, "kind": kind})


def describe(err: stripe.StripeError) -> str:
    """A short name for a provider error: `ReadTimeout`, `APIError 500`."""
    network = re.search(r"Network error: (\w+)", str(err))
    if network:
        return network.group(1)
    return f"{type(err).__name__} {err.http_status}" if err.http_status else type(err).__name__


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Blocking SQLite and HTTP run off the event loop so heartbeats keep flowing."""
    return await asyncio.to_thread(fn, *args)


def _owner() -> str:
    """This attempt: the call (workflow run and activity id) and the attempt number."""
    info = activity.info()
    return f"{info.workflow_id}/{info.workflow_run_id}/{info.activity_id}#{info.attempt}"


def _same_call(owner: str | None, other: str) -> bool:
    return owner is not None and owner.split("#")[0] == other.split("#")[0]


def _attempt() -> int:
    return activity.info().attempt


def _require_key(call: ToolInput) -> str:
    if not call.intent_key:
        raise ApplicationError(f"{call.tool} needs an intent key", type="InvalidToolInput", non_retryable=True)
    return call.intent_key


def _not_performed(call: ToolInput, reason: str, message: str, retryable: bool = False) -> ToolResult:
    return ToolResult(tool=call.tool, outcome=Outcome.NOT_PERFORMED, intent_key=call.intent_key, reason=reason,
                      message=message, retryable=retryable, attempt=_attempt())


def _read_error(call: ToolInput, reason: str, message: str) -> ToolResult:
    return ToolResult(tool=call.tool, reason=reason, message=message, attempt=_attempt())
