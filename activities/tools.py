"""Tool activities. All I/O lives here; each tool answers with one of the four outcomes.

A tool's activity is a method marked `@tool(name)` with the name of its declaration in
core/tools.py; `tool_activities` collects the marked methods, so the worker registers a tool by
holding the object that implements it (activities/courier.py is a tool outside this class).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from temporalio import activity

from activities.claims import Truth, payment_records, refund_records
from activities.db import Database
from activities.effects import PROVIDER_ERRORS, Ask, Attempt, Effects, Intent, ProviderEffect, ProviderTerms, describe
from activities.faults import crash_point
from activities.ledger import EffectLedger, Hold, invoice_resource, item_resource, order_resource
from activities.payments import KEY_FIELD, StripeGateway, intent_key_of, metadata_of
from activities.records import (
    MessageLimits,
    OrderRecord,
    Outgoing,
    OverCap,
    Records,
    header_problem,
    send_once,
    upsert_confirmation,
)
from core.authority import Ceilings
from core.claims import compose, money_in_text, money_sentence, payment_sentence
from core.contacts import contacts_in
from core.domain import Order
from core.failures import InvalidToolInput
from core.models import InspectInput, IntentView, Outcome, SettleInput, SettleVerdict, ToolInput, ToolResult
from core.tools import (
    REGISTRY,
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



_TOOL = "__tool_name__"
_P = ParamSpec("_P")
_R = TypeVar("_R")
_Fn = TypeVar("_Fn", bound=Callable[..., Any])


def tool(name: str) -> Callable[[_Fn], _Fn]:
    """Mark a method as the activity of the declared tool `name` (registered under that name)."""
    if name not in REGISTRY:
        raise LookupError(f"no tool {name!r} is declared in core/tools.py")

    def mark(fn: _Fn) -> _Fn:
        setattr(fn, _TOOL, name)
        return activity.defn(name=name)(fn)
    return mark


def tool_activities(implementation: object) -> list[Callable[..., Any]]:
    """The bound `@tool` methods of an object, in declaration order."""
    found = {getattr(m, _TOOL): m for m in (getattr(implementation, n) for n in dir(type(implementation)))
             if callable(m) and hasattr(m, _TOOL)}
    return [found[name] for name in REGISTRY if name in found]


@dataclass(frozen=True)
class _Party:
    """A party of an order a tool writes to: the message's kind, its address and subject, and the
    other party's contact it may not carry (label: value, core/contacts.py)."""

    kind: str
    address: Callable[[Order], str]
    subject: str  # formatted with the order_id
    withheld: Callable[[Order], dict[str, str]]


_CUSTOMER = _Party("email", lambda o: o.customer_email, "Your order {order_id}",
                   lambda o: {"seller email": o.seller_email})
_SELLER = _Party("seller_message", lambda o: o.seller_email, "Order {order_id}",
                 lambda o: {"customer email": o.customer_email, "customer name": o.customer_name})


@dataclass(frozen=True)
class _Envelope:
    """What a message tool sends besides its body: the kind of message, to whom, and its subject."""

    kind: str
    recipient: str
    subject: str


class ToolActivities:
    """Holds the stores and the payment gateway; one `@tool` method per tool."""

    def __init__(self, db: Database, gateway: StripeGateway, ceilings: Ceilings, terms: ProviderTerms | None = None,
                 limits: MessageLimits | None = None) -> None:
        self._db = db
        self._limits = limits or MessageLimits()
        self._records = Records(db)
        self._gateway = gateway
        self._ceiling = ceilings.refund_cents
        self._payment_ceiling = ceilings.payment_cents
        self._effects = Effects(EffectLedger(db), terms or ProviderTerms())

    def activities(self) -> list[Callable[..., Any]]:
        return [*tool_activities(self), self.record_human_decision, self.inspect_intent]

    # --- reads -------------------------------------------------------------------------

    @tool("get_order")
    async def get_order(self, call: ToolInput) -> ToolResult:
        return await in_thread(self._get_order, call)

    def _get_order(self, call: ToolInput) -> ToolResult:
        args = GetOrderArgs.model_validate(call.arguments)
        record = self._records.order(args.order_id)
        if record is None:
            return _read_error(call, "unknown_order", f"no order {args.order_id}")
        refunds = [r for r in self._gateway.refunds(record.payment_intent_id) if r.status in ("succeeded", "pending")]
        order = record.order
        by_item = {i.item_id: sum(r.amount for r in refunds if metadata_of(r).get("item_id") == i.item_id)
                   for i in order.items}
        refunded = sum(r.amount for r in refunds)
        return ToolResult(tool=call.tool, attempt=attempt_number(), data={
            **order.model_dump(), "paid_cents": order.paid_cents, "refunded_cents": refunded,
            "refundable_cents": order.paid_cents - refunded, "refunded_cents_by_item": by_item,
            "approval_ceiling_cents": self._ceiling})

    @tool("search_policy")
    async def search_policy(self, call: ToolInput) -> ToolResult:
        args = SearchPolicyArgs.model_validate(call.arguments)
        words = set(args.query.lower().split())
        hits = [text for topic, text in POLICY.items() if topic in words or any(w in text.lower() for w in words)]
        return ToolResult(tool=call.tool, attempt=attempt_number(), data={"passages": hits or list(POLICY.values())})

    @tool("lookup_invoice")
    async def lookup_invoice(self, call: ToolInput) -> ToolResult:
        return await in_thread(self._lookup_invoice, call)

    def _lookup_invoice(self, call: ToolInput) -> ToolResult:
        args = LookupInvoiceArgs.model_validate(call.arguments)
        record = self._records.invoice(args.invoice_id)
        if record is None:
            return _read_error(call, "unknown_invoice", f"no invoice {args.invoice_id}")
        return ToolResult(tool=call.tool, attempt=attempt_number(), data=record.invoice.model_dump())

    # --- money: validation, then one call into the effect protocol ------------------------

    @tool("issue_refund")
    async def issue_refund(self, call: ToolInput) -> ToolResult:
        return await in_thread(self._issue_refund, call)

    def _issue_refund(self, call: ToolInput) -> ToolResult:
        args = IssueRefundArgs.model_validate(call.arguments)
        key = require_key(call)
        record = self._records.order(args.order_id)
        if record is None:
            return not_performed(call, "unknown_order", f"no order {args.order_id}")
        order, pi = record.order, record.payment_intent_id
        item = next((i for i in order.items if i.item_id == args.item_id), None)
        if item is None:
            return not_performed(call, "unknown_item", f"order {order.order_id} has no item {args.item_id}")
        if args.currency != order.currency:
            return not_performed(call, "currency_mismatch", f"order is in {order.currency}, not {args.currency}")
        if args.amount_cents > item.amount_cents:
            return not_performed(call, "exceeds_item_price", f"item {item.item_id} cost {item.amount_cents} cents")
        metadata = {"task_id": call.task_id, "order_id": order.order_id, "item_id": item.item_id}
        if call.approval is not None and call.approval.intent_key == key:
            metadata["approved_by"] = call.approval.decided_by
        return self._effects.perform(Intent(
            call=call, key=key, amount=args.amount_cents, ceiling_cents=_narrowest(self._ceiling, call.ceiling_cents),
            holds=(Hold(item_resource(order.order_id, item.item_id), item.amount_cents, args.amount_cents),
                   Hold(order_resource(order.order_id), order.paid_cents, args.amount_cents)),
            records=self._refunds_of(order.order_id, pi),
            send=lambda: _refund_effect(self._gateway.refund(pi, args.amount_cents, key, metadata), order.order_id),
        ))

    @tool("send_payment")
    async def send_payment(self, call: ToolInput) -> ToolResult:
        return await in_thread(self._send_payment, call)

    def _send_payment(self, call: ToolInput) -> ToolResult:
        args = SendPaymentArgs.model_validate(call.arguments)
        key = require_key(call)
        record = self._records.invoice(args.invoice_id)
        if record is None:
            return not_performed(call, "unknown_invoice", f"no invoice {args.invoice_id}")
        invoice, payee_ref = record.invoice, record.customer_ref
        if args.payee != invoice.payee:
            return not_performed(call, "payee_mismatch", f"invoice {invoice.invoice_id} is payable to {invoice.payee}")
        if args.currency != invoice.currency:
            return not_performed(call, "currency_mismatch", f"invoice is in {invoice.currency}")
        if args.amount_cents != invoice.amount_cents:
            return not_performed(call, "amount_mismatch", f"invoice amount is {invoice.amount_cents} cents")
        metadata = {"task_id": call.task_id, "invoice_id": invoice.invoice_id, KEY_FIELD: key}
        if call.approval is not None and call.approval.intent_key == key:
            metadata["approved_by"] = call.approval.decided_by

        return self._effects.perform(Intent(
            call=call, key=key, amount=args.amount_cents,
            ceiling_cents=_narrowest(self._payment_ceiling, call.ceiling_cents),
            holds=(Hold(invoice_resource(invoice.invoice_id), invoice.amount_cents, args.amount_cents),),
            records=self._payments_of(invoice.invoice_id, payee_ref),
            send=lambda: _payment_effect(self._gateway.charge(payee_ref, args.amount_cents, args.currency, metadata,
                                                              key)),
        ))

    # --- a human's word on an effect -----------------------------------------------------

    @activity.defn(name="record_human_decision")
    async def record_human_decision(self, settle: SettleInput) -> SettleVerdict | None:
        """mark_performed / mark_not_performed, recorded only when the provider's records agree."""
        return await in_thread(self._record_human_decision, settle)

    def _record_human_decision(self, settle: SettleInput) -> SettleVerdict:
        read, resources = self._provider_view(settle.tool, settle.arguments)
        records, read_at = None, time.time()
        if read is not None:
            try:
                records = read()
            except PROVIDER_ERRORS as err:
                if settle.status == "performed":
                    return SettleVerdict(applied=False, why=f"the provider's records cannot be read now "
                                                            f"({describe(err)}): send it again later")
        return self._effects.decide(settle, records, resources or (settle.intent_key,), read_at, Ask.current())

    @activity.defn(name="inspect_intent")
    async def inspect_intent(self, call: InspectInput) -> IntentView:
        """The ledger and the provider on one intent, read before a person is asked about it."""
        return await in_thread(self._inspect_intent, call)

    def _inspect_intent(self, call: InspectInput) -> IntentView:
        read, _ = self._provider_view(call.tool, call.arguments)
        return self._effects.inspect(call.intent_key, read, Ask.current())

    def _provider_view(self, tool: str, arguments: dict[str, Any]
                       ) -> tuple[Callable[[], list[ProviderEffect]] | None, tuple[str, ...]]:
        """How to read an intent's effects at its provider, and the resources it holds (its subject
        first); (None, ()) for an effect with no provider records of ours."""
        if tool == "issue_refund":
            record = self._records.order(str(arguments.get("order_id")))
            if record is not None:
                order_id = record.order.order_id
                return (self._refunds_of(order_id, record.payment_intent_id),
                        (item_resource(order_id, str(arguments.get("item_id"))), order_resource(order_id)))
        elif tool == "send_payment":
            invoice_record = self._records.invoice(str(arguments.get("invoice_id")))
            if invoice_record is not None:
                invoice_id = invoice_record.invoice.invoice_id
                return self._payments_of(invoice_id, invoice_record.customer_ref), (invoice_resource(invoice_id),)
        return None, ()

    def _refunds_of(self, order_id: str, payment_intent_id: str) -> Callable[[], list[ProviderEffect]]:
        return lambda: [_refund_effect(r, order_id) for r in self._gateway.refunds(payment_intent_id)]

    def _payments_of(self, invoice_id: str, payee_ref: str) -> Callable[[], list[ProviderEffect]]:
        return lambda: [_payment_effect(p) for p in self._gateway.payments_to(payee_ref)
                        if metadata_of(p).get("invoice_id") == invoice_id]

    # --- writes to people and records --------------------------------------------------

    # Each runs as one function in one thread: a hop to a thread and back costs more CPU than most of
    # these reads, and a busy worker's profile counted them.

    @tool("write_confirmation")
    async def write_confirmation(self, call: ToolInput) -> ToolResult:
        return await in_thread(self._write_confirmation, call)

    def _write_confirmation(self, call: ToolInput) -> ToolResult:
        args = WriteConfirmationArgs.model_validate(call.arguments)
        record = self._records.order(args.order_id)
        if record is None:
            return not_performed(call, "unknown_order", f"no order {args.order_id}")
        upsert_confirmation(self._db, call.task_id, args.order_id, args.text)
        return ToolResult(tool=call.tool, outcome=Outcome.PERFORMED, intent_key=call.intent_key,
                          attempt=attempt_number(), data={"order_id": args.order_id})

    @tool("notify_customer")
    async def notify_customer(self, call: ToolInput) -> ToolResult:
        return await in_thread(self._to_party, call, NotifyCustomerArgs.model_validate(call.arguments), _CUSTOMER)

    @tool("message_seller")
    async def message_seller(self, call: ToolInput) -> ToolResult:
        return await in_thread(self._to_party, call, MessageSellerArgs.model_validate(call.arguments), _SELLER)

    def _to_party(self, call: ToolInput, args: NotifyCustomerArgs | MessageSellerArgs, party: _Party) -> ToolResult:
        """A message to a party of an order on record: its customer or its seller, never an address
        the model chose. Its money facts are checked before it is sent (`_money_statement`), then what
        it says of the other party (`_Party.withheld`); the money sentence is the product's, written
        from the records."""
        record = self._records.order(args.order_id)
        if record is None:
            return not_performed(call, "unknown_order", f"no order {args.order_id}")
        order = record.order
        to = _Envelope(party.kind, party.address(order), party.subject.format(order_id=args.order_id))
        if self._in_outbox(require_key(call)):  # sent already: answered as sent, not checked again
            return self._send(call, to, args.message)
        statement = self._money_statement(call, args, record)
        if isinstance(statement, ToolResult):
            return statement
        body = compose(args.message, statement)
        leaked = contacts_in(body, party.withheld(order))  # the whole body: an item_id lands in the money sentence
        if leaked:
            return _refused(call, "other_party_data",
                            f"the message holds the {' and the '.join(leaked)} of the order's other party; nothing "
                            f"was sent. Write it without them: each party is told only what is theirs.",
                            {"found": leaked})
        return self._send(call, to, body, statement)

    def _money_statement(self, call: ToolInput, args: NotifyCustomerArgs | MessageSellerArgs,
                         record: OrderRecord) -> str | ToolResult | None:
        """The money sentence for the message's `refund_status`, from the ledger and the provider; None
        when it states none; a refusal when its free text states money facts or its status is false."""
        refused = _money_in_free_text(call, args.message, _TO_PARTY)
        if refused is not None or args.refund_status is None:
            return refused
        order = record.order
        truth = refund_records(self._db, self._gateway, call.task_id, record, args.item_id)
        subject = f"{'item ' + args.item_id + ' of ' if args.item_id else ''}order {order.order_id}"
        refused = _unchecked_claim(call, "refund_status", args.refund_status, subject, truth)
        if refused is not None:
            return refused
        return money_sentence(args.refund_status, order.order_id, args.item_id, truth.effects)

    def _in_outbox(self, key: str) -> bool:
        with self._db.connect() as conn:
            return conn.execute("SELECT 1 FROM outbox WHERE intent_key = :key", {"key": key}).fetchone() is not None

    @tool("schedule_pickup")
    async def schedule_pickup(self, call: ToolInput) -> ToolResult:
        return await in_thread(self._schedule_pickup, call)

    def _schedule_pickup(self, call: ToolInput) -> ToolResult:
        args = SchedulePickupArgs.model_validate(call.arguments)
        record = self._records.order(args.order_id)
        if record is None or not any(i.item_id == args.item_id for i in record.order.items):
            return not_performed(call, "unknown_item", f"order {args.order_id} has no item {args.item_id}")
        return self._send(call, _Envelope("pickup", "courier", f"Pickup {args.order_id}/{args.item_id}"),
                          f"Collect {args.item_id} from {record.order.customer_name}")

    @tool("send_email")
    async def send_email(self, call: ToolInput) -> ToolResult:
        """An email to a party on record; its money facts are checked as a message to an order's party's
        are: none in the subject or free text, the payment's status against the ledger and the provider."""
        return await in_thread(self._send_email, call)

    def _send_email(self, call: ToolInput) -> ToolResult:
        args = SendEmailArgs.model_validate(call.arguments)
        if self._in_outbox(require_key(call)):  # sent already: answered as sent, not checked again
            return self._send(call, _Envelope("email", args.to, args.subject), args.body)
        statement = self._payment_statement(call, args)
        if isinstance(statement, ToolResult):
            return statement
        return self._send(call, _Envelope("email", args.to, args.subject), compose(args.body, statement), statement)

    def _payment_statement(self, call: ToolInput, args: SendEmailArgs) -> str | ToolResult | None:
        """The money sentence for the email's `payment_status`, from the records; None when it states none;
        a refusal when its subject or free text states money facts or its status is false."""
        refused = _money_in_free_text(call, f"{args.subject}\n{args.body}", _TO_PAYEE)
        if refused is not None or args.payment_status is None:
            return refused
        record = self._records.invoice(args.invoice_id) if args.invoice_id else None
        if record is None:
            return not_performed(call, "unknown_invoice", f"payment_status needs the invoice it speaks of; "
                                                          f"no invoice {args.invoice_id}")
        invoice_id = record.invoice.invoice_id
        truth = payment_records(self._db, self._gateway, call.task_id, record)
        refused = _unchecked_claim(call, "payment_status", args.payment_status, f"invoice {invoice_id}", truth)
        if refused is not None:
            return refused
        return payment_sentence(args.payment_status, invoice_id, truth.effects)

    def _send(self, call: ToolInput, to: _Envelope, body: str, statement: str | None = None) -> ToolResult:
        key = require_key(call)
        kind, recipient = to.kind, to.recipient
        message = Outgoing(intent_key=key, task_id=call.task_id, tool=call.tool, arguments=call.arguments,
                           owner=Attempt.current().call, recipient=recipient, kind=kind, subject=to.subject,
                           body=body)
        problem = header_problem(message)
        if problem is not None:
            return not_performed(call, "unsafe_header", f"{problem}; nothing was sent")
        sent = send_once(self._db, message, self._limits)
        if isinstance(sent, OverCap):
            return _over_cap(call, recipient, sent)
        crash_point(f"{call.tool}:after_send")
        outcome = Outcome.PERFORMED if (sent.now or sent.mine) else Outcome.ALREADY_PERFORMED
        data = {"recipient": recipient, "kind": kind, **({"money_statement": statement} if statement else {})}
        return ToolResult(tool=call.tool, outcome=outcome, intent_key=key, attempt=attempt_number(), data=data)


async def in_thread(fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
    """Blocking SQLite and HTTP run off the event loop, which other attempts and workflow tasks share
    (heartbeats do not depend on it: activities/heartbeats.py)."""
    return await asyncio.to_thread(fn, *args, **kwargs)


def attempt_number() -> int:
    return activity.info().attempt


def require_key(call: ToolInput) -> str:
    if not call.intent_key:
        raise InvalidToolInput(f"{call.tool} needs an intent key")
    return call.intent_key


def not_performed(call: ToolInput, reason: str, message: str, retryable: bool = False) -> ToolResult:
    return ToolResult(tool=call.tool, outcome=Outcome.NOT_PERFORMED, intent_key=call.intent_key, reason=reason,
                      message=message, retryable=retryable, attempt=attempt_number())


def _refused(call: ToolInput, reason: str, message: str, data: dict[str, Any]) -> ToolResult:
    """A message not sent because of what it says: the model may write it again."""
    return not_performed(call, reason, message, retryable=True).model_copy(update={"data": data})


@dataclass(frozen=True)
class _Wording:
    """How a refusal of money facts in a message's free text names the message and the fields that
    state them instead."""

    message: str  # "message", "email"
    where: str  # where the model's own words are
    pronoun: str  # for those words
    effect: str  # what the message speaks of
    fields: str  # the fields that state it


_TO_PARTY = _Wording("message", "free text", "it", "refund", "refund_status")
_TO_PAYEE = _Wording("email", "subject or free text", "them", "payment", "payment_status and invoice_id")


def _money_in_free_text(call: ToolInput, text: str, wording: _Wording) -> ToolResult | None:
    """The refusal of a message whose model-written text states money facts (core/claims.py), or None."""
    facts = money_in_text(text)
    if not facts:
        return None
    return _refused(call, "money_in_free_text",
                    f"the {wording.message} states money facts in its {wording.where} ({', '.join(facts[:5])}); "
                    f"nothing was sent. Write {wording.pronoun} without amounts, currencies, references or money "
                    f"words, and say what happened to the {wording.effect} with {wording.fields}: the product adds "
                    "the amount and reference from its records.", {"free_text_money": facts})


def _unchecked_claim(call: ToolInput, field: str, claimed: str, subject: str,
                     truth: Truth[Any, Any]) -> ToolResult | None:
    """Why a message's money status (`field` = `claimed`, about `subject`) cannot be sent as the records
    (`truth`) stand: they cannot be read now, or they show another status; None when they allow it."""
    if truth.unreadable:
        return not_performed(call, "records_unreadable", f"{truth.detail}; nothing was sent", retryable=True)
    if truth.allows(claimed):
        return None
    return _refused(call, "false_money_claim",
                    f"{field} {claimed!r} for {subject} is false; nothing was sent. The records show "
                    f"{truth.status or 'no one status'}: {truth.detail}.",
                    {"claimed": claimed, "records_show": truth.status, "records": truth.rows})


def _over_cap(call: ToolInput, recipient: str, over: OverCap) -> ToolResult:
    """Not sent, and sending it again will not help: the task has used its messages."""
    whom = f"to {recipient}" if over.scope == "recipient" else "in all"
    message = (f"this task has sent {over.sent} messages {whom}, its cap of {over.cap} per {over.scope}; nothing "
               f"was sent. No more can be sent {whom} by this task: escalate_to_human if more must be said.")
    return not_performed(call, "message_cap", message).model_copy(
        update={"data": {"scope": over.scope, "cap": over.cap, "sent": over.sent, "recipient": recipient}})


def _read_error(call: ToolInput, reason: str, message: str) -> ToolResult:
    return ToolResult(tool=call.tool, reason=reason, message=message, attempt=attempt_number())


def _narrowest(*ceilings: int | None) -> int | None:
    """The lowest ceiling set: a task's own may narrow the worker's, never widen it."""
    return min((c for c in ceilings if c is not None), default=None)


def _refund_effect(refund: Any, order_id: str) -> ProviderEffect:
    item_id = metadata_of(refund).get("item_id")
    resources = (item_resource(order_id, item_id), order_resource(order_id)) if item_id else (order_resource(order_id),)
    return ProviderEffect(ref=refund.id, amount_cents=refund.amount, intent_key=intent_key_of(refund),
                          resources=resources, status=refund.status)


def _payment_effect(payment: Any) -> ProviderEffect:
    invoice_id = metadata_of(payment).get("invoice_id")
    return ProviderEffect(ref=payment.id, amount_cents=payment.amount, intent_key=intent_key_of(payment),
                          resources=(invoice_resource(invoice_id),) if invoice_id else (), status=payment.status)
