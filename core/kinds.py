"""Task kinds: what a task of each kind may touch.

A kind offers the tools whose declaration names it (core/tools.py `ToolSpec.kinds`, so a tool is
declared in one place) and names the facts that bind it to business records. The worker's
configuration may narrow a kind's tools; a task input may narrow them further, never widen them
(core/authority.py `narrow`).

Facts come from our systems (`TaskInput.facts`, a `dict[str, str]`), never from the model, and
core/authority.py `out_of_scope` holds every call to them:

- `binds`: the record the task is about. A refund ticket, a refund request and a return pickup act
  on one `order_id`, a supplier payment on one `invoice_id`; the fact is required, and a call
  naming any other (or naming none of the kind's records, e.g. an invoice in a refund ticket) is
  out of scope.
- `narrows`: what the task may do within that record, bound only where the facts name it:
  `item_id` (refund ticket, refund request, return pickup: which items of the order may be
  refunded, picked up), `payee` (supplier payment: whom `send_payment` may pay) and `recipient`
  (supplier payment: the address `send_email` may write to, besides being a party on record).
  A fact names one value or several separated by commas (`"item_id": "kettle-01,mugs-02"` for a
  ticket about two items); spaces around each are ignored, and an empty fact names nothing. When a
  task's facts do not name one (SU-88421 names only its order), the order or invoice binding alone
  applies. A call outside what the facts name is refused `out_of_scope`: it needs a person
  (the model is told, and may call `escalate_to_human`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.models import TaskKind
from core.tools import REGISTRY

__all__ = ["FACT_OF_ARGUMENT", "KINDS", "TICKETS", "KindSpec", "TaskKind", "TicketKind", "fact_values"]

# The argument each narrowing fact holds, where the two names differ (send_email's `to`).
FACT_OF_ARGUMENT = {"to": "recipient"}


@dataclass(frozen=True)
class KindSpec:
    """`binds` are the facts every business id in a call must match (`order_id`, `invoice_id`);
    `narrows` the arguments a fact of the same name (`FACT_OF_ARGUMENT` where it differs) limits
    when the task's facts name one: `item_id`, `payee`, `to` (the fact `recipient`)."""

    tools: tuple[str, ...]
    binds: tuple[str, ...]
    narrows: tuple[str, ...] = field(default=())


_BINDS = {
    TaskKind.REFUND_TICKET: (("order_id",), ("item_id",)),
    TaskKind.REFUND_REQUEST: (("order_id",), ("item_id",)),
    TaskKind.SUPPLIER_PAYMENT: (("invoice_id",), ("payee", "to")),
    TaskKind.RETURN_PICKUP: (("order_id",), ("item_id",)),
}

KINDS: dict[TaskKind, KindSpec] = {
    kind: KindSpec(tools=tuple(name for name, spec in REGISTRY.items() if kind in spec.kinds), binds=binds,
                   narrows=narrows)
    for kind, (binds, narrows) in _BINDS.items()
}


def fact_values(facts: dict[str, str], name: str) -> tuple[str, ...]:
    """The values a fact names: one, or several separated by commas; () when the facts name none."""
    return tuple(v.strip() for v in str(facts.get(name) or "").split(",") if v.strip())


@dataclass(frozen=True)
class TicketKind:
    """A kind of ticket a team's own system files, and the task kind it becomes."""

    task_kind: TaskKind
    description: str

    @property
    def required_facts(self) -> tuple[str, ...]:
        return KINDS[self.task_kind].binds


TICKETS: dict[str, TicketKind] = {
    "support": TicketKind(TaskKind.REFUND_TICKET,
                          "a support ticket: look up the order, check the policy, refund the item, tell the seller, "
                          "book the return pickup, tell the customer (facts: order_id; item_id optional, binds the "
                          "items)"),
    "refund": TicketKind(TaskKind.REFUND_REQUEST,
                         "a refund request: look up the order, refund the item, write the confirmation, tell the "
                         "customer (facts: order_id; item_id optional, binds the items)"),
    "payables": TicketKind(TaskKind.SUPPLIER_PAYMENT,
                           "an approved supplier invoice: look it up, pay it, email the remittance (facts: "
                           "invoice_id; payee and recipient optional, bind them)"),
}
