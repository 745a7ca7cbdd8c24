"""A ticket from a team's own system, and the task it becomes."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from core.domain import Order
from core.kinds import TICKETS, fact_values
from core.models import TaskInput

TicketKindName = Literal["support", "refund", "payables"]


class TicketError(ValueError):
    """A ticket that cannot become a task: said in one line."""


class Ticket(BaseModel):
    """A ticket from your own system, as `start` takes it on the command line or in a JSON file.

    `facts` come from your systems (the order or invoice the ticket is about), never from the
    ticket's text: the agent may only touch them. `order` is for the local stack only: an order
    `python -m devstack seed-tickets` creates and pays at the local provider.
    """

    kind: TicketKindName
    ticket_id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    text: str = Field(min_length=1, max_length=20_000)
    facts: dict[str, str] = Field(default_factory=dict)
    order: Order | None = None

    def task_input(self) -> TaskInput:
        """The task: its id comes from the ticket id, so the same ticket always names the same task."""
        kind = TICKETS[self.kind]
        facts = {**({"order_id": self.order.order_id} if self.order else {}), **self.facts}
        missing = [f for f in kind.required_facts if not facts.get(f)]
        if missing:
            raise TicketError(f"a {self.kind} ticket needs the fact(s) {', '.join(missing)}")
        facts_text = "\n".join(f"{name}: {value}" for name, value in sorted(facts.items()))
        return TaskInput(task_id=f"ticket-{self.ticket_id}", scenario=self.kind, kind=kind.task_kind,
                         brief=f"{self.text}\n\nFacts from our systems:\n{facts_text}", facts=facts)

    def amount_cents(self) -> int | None:
        """What the ticket's own order says the named items cost (local tickets carry their order)."""
        if self.order is None:
            return None
        named = fact_values(self.facts, "item_id")
        items = [i for i in self.order.items if not named or i.item_id in named]
        return sum(i.amount_cents for i in items) if items else None


def read_ticket_file(path: Path) -> list[Ticket]:
    """Tickets from a JSON file (one object) or a JSONL file (one object a line)."""
    try:
        text = path.read_text()
    except OSError as err:
        raise TicketError(f"cannot read {path}: {err.strerror}") from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    chunks = [(1, text)] if path.suffix == ".json" else lines
    tickets = []
    for n, chunk in chunks:
        try:
            tickets.append(Ticket.model_validate_json(chunk))
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "the ticket"
            raise TicketError(f"{path}:{n}: {where}: {first['msg']}") from None
    if not tickets:
        raise TicketError(f"{path} holds no ticket")
    return tickets
