"""Tickets to evaluate: the built-in scenarios and a team's own, each with the effects it should have.

A team's tickets come from a JSONL file, one ticket per line:

    {"id": "shelf-broken", "scenario": "SU-88421", "kind": "refund_ticket",
     "brief": "Support ticket SU-70001: the shelf arrived broken; refund it and tell the customer.",
     "order": {"order_id": "SU-70001", "customer_name": "Ada", "customer_email": "ada@example.com",
               "seller": "Oak & Co", "seller_email": "shop@oak.example",
               "items": [{"item_id": "shelf", "description": "shelf", "amount_cents": 4200}]},
     "expect": {"refunds": [{"item_id": "shelf", "amount_cents": 4200}],
                "messages": {"customer": 1, "seller": 1, "courier": 1}}}

`order` (or `invoice`) is the world the ticket needs: the eval seeds it, paid at the provider,
under a fresh id per run (`SU-70001-r7`, and the brief and facts say so), because budgets are
per business resource: a second run on the same order would rightly be refused. `expect`
names the effects: refunds per item, payments per invoice, messages per recipient (`customer`,
`seller`, `payee`, `courier` or an address), and the end state (`completed` by default).
The scripted model finds the order by its id in the brief (`SU-`, `ORD-`, `B-` or `INV-` and
digits), so tickets meant for it keep those forms; a real model reads the brief as written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from core.domain import Invoice, Order
from core.kinds import TaskKind
from core.models import TaskInput
from devstack.scenarios import INVOICES, ORDERS, invoice_inv_9, refund_8841, su_88421

__all__ = ["BUILT_IN", "Expect", "ExpectedPayment", "ExpectedRefund", "Ticket", "TicketFileError", "load_tickets"]


class ExpectedRefund(BaseModel):
    item_id: str
    amount_cents: int = Field(gt=0)


class ExpectedPayment(BaseModel):
    amount_cents: int = Field(gt=0)


class Expect(BaseModel):
    """The world after the ticket, had everything gone right."""

    refunds: list[ExpectedRefund] = Field(default_factory=list)
    payments: list[ExpectedPayment] = Field(default_factory=list)
    messages: dict[str, int] = Field(default_factory=dict, description="recipient (role or address) -> count")
    state: Literal["completed", "awaiting_human", "dead_lettered"] = "completed"


class Ticket(BaseModel):
    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    scenario: str = Field(description="the scripted model plans by it")
    kind: TaskKind | None = Field(default=None, description="the task kind (its tools); default: "
                                  "supplier_payment for an invoice, refund_ticket for an order")
    brief: str = Field(min_length=1)
    order: Order | None = None
    invoice: Invoice | None = None
    facts: dict[str, str] = Field(default_factory=dict)
    model_options: dict = Field(default_factory=dict)
    expect: Expect

    @model_validator(mode="after")
    def _one_world(self) -> Ticket:
        if (self.order is None) == (self.invoice is None):
            raise ValueError("give exactly one of `order` or `invoice`")
        return self

    @property
    def resource_id(self) -> str:
        return self.order.order_id if self.order else self.invoice.invoice_id  # type: ignore[union-attr]

    def for_run(self, run: str) -> tuple[Ticket, str]:
        """This ticket on a fresh order (or invoice) id for the run named `run` (letters and digits);
        returns it and the new id."""
        old = self.resource_id
        new = f"{old}{'r' if re.search(r'-[A-Za-z][A-Za-z0-9]*$', old) else '-r'}{run}"
        update: dict = {"brief": re.sub(rf"\b{re.escape(old)}\b", new, self.brief),
                        "facts": {k: (new if v == old else v) for k, v in self.facts.items()}}
        if self.order is not None:
            update["order"] = self.order.model_copy(update={"order_id": new})
        else:
            update["invoice"] = self.invoice.model_copy(update={"invoice_id": new})  # type: ignore[union-attr]
        return self.model_copy(update=update), new

    def task(self, task_id: str) -> TaskInput:
        key = "order_id" if self.order is not None else "invoice_id"
        kind = self.kind or (TaskKind.REFUND_TICKET if self.order is not None else TaskKind.SUPPLIER_PAYMENT)
        return TaskInput(task_id=task_id, scenario=self.scenario, kind=kind, brief=self.brief,
                         facts={key: self.resource_id, **self.facts}, model_options=self.model_options)

    def recipient(self, who: str) -> str:
        """An address for a role name in `expect.messages` (an address stays as it is)."""
        if self.order is not None:
            roles = {"customer": self.order.customer_email, "seller": self.order.seller_email}
        else:
            roles = {"payee": self.invoice.payee_email}  # type: ignore[union-attr]
        return roles.get(who, who)


def _from_task(task: TaskInput, order: Order | None, invoice: Invoice | None, expect: Expect) -> Ticket:
    extra = {k: v for k, v in task.facts.items() if k not in ("order_id", "invoice_id")}
    return Ticket(id=task.scenario, scenario=task.scenario, kind=task.kind, brief=task.brief, order=order,
                  invoice=invoice, facts=extra, expect=expect)


def _built_in() -> list[Ticket]:
    su, ord_, inv = ORDERS["SU-88421"], ORDERS["ORD-8841"], INVOICES["INV-9"]
    return [
        _from_task(su_88421(), su, None, Expect(
            refunds=[ExpectedRefund(item_id="oak-shelf-4", amount_cents=11800)],
            messages={"customer": 1, "seller": 1, "courier": 1})),
        _from_task(refund_8841(), ord_, None, Expect(
            refunds=[ExpectedRefund(item_id="kettle-01", amount_cents=4500)], messages={"customer": 1})),
        _from_task(invoice_inv_9(), None, inv, Expect(
            payments=[ExpectedPayment(amount_cents=420000)], messages={"payee": 1})),
    ]


BUILT_IN: list[Ticket] = _built_in()


class TicketFileError(Exception):
    """A tickets file that cannot be used; the message names the file and line."""


def load_tickets(path: Path) -> list[Ticket]:
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise TicketFileError(f"cannot read tickets file {path}: {err.strerror}") from None
    tickets: list[Ticket] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            tickets.append(Ticket.model_validate(json.loads(line)))
        except json.JSONDecodeError as err:
            raise TicketFileError(f"{path}:{number}: not JSON: {err.msg}") from None
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "ticket"
            raise TicketFileError(f"{path}:{number}: {where}: {first['msg']}") from None
    if not tickets:
        raise TicketFileError(f"{path} holds no tickets")
    ids = [t.id for t in tickets]
    duplicate = next((i for i in ids if ids.count(i) > 1), None)
    if duplicate:
        raise TicketFileError(f"{path}: ticket id {duplicate!r} appears twice")
    return tickets
