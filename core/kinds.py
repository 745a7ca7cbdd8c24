"""Task kinds: what a task of each kind may touch.

A kind names its tools (the only ones its model is offered and its gate runs) and the facts that
bind it to business records: a refund ticket and a refund request act on one order, a supplier
payment on one invoice. The worker's configuration may narrow a kind's tools; a task input may
narrow them further, never widen them (core/authority.py `narrow`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class TaskKind(StrEnum):
    REFUND_TICKET = "refund_ticket"
    REFUND_REQUEST = "refund_request"
    SUPPLIER_PAYMENT = "supplier_payment"


@dataclass(frozen=True)
class KindSpec:
    """`binds` are the facts every business id in a call must match (`order_id`, `invoice_id`)."""

    tools: tuple[str, ...]
    binds: tuple[str, ...]


KINDS: dict[TaskKind, KindSpec] = {
    TaskKind.REFUND_TICKET: KindSpec(
        tools=("get_order", "search_policy", "issue_refund", "message_seller", "schedule_pickup",
               "notify_customer", "escalate_to_human"),
        binds=("order_id",)),
    TaskKind.REFUND_REQUEST: KindSpec(
        tools=("get_order", "search_policy", "issue_refund", "write_confirmation", "notify_customer",
               "escalate_to_human"),
        binds=("order_id",)),
    TaskKind.SUPPLIER_PAYMENT: KindSpec(
        tools=("lookup_invoice", "send_payment", "send_email", "escalate_to_human"),
        binds=("invoice_id",)),
}
