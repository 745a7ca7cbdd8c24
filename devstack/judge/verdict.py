"""What the judge says: per ticket, item, order and invoice, the escalations it checked, and the findings.

A finding is laid on the tickets it concerns; a ticket with any finding is *flagged*.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from devstack.judge.tasks import EndState

# Every kind of finding (each flags the tickets it names), in the order the table lists them.
KINDS = ("lost", "too many", "too few", "wrong amount", "refund of no ticket", "refund of no ticket's item",
         "wrong order", "beyond payment", "one ticket, several", "one intent, several", "no ledger row",
         "ledger names another", "ledger says not performed", "ledger without provider", "order unknown",
         "message sent twice", "told nothing", "message to a stranger", "false message")


@dataclass(frozen=True)
class Ticket:
    """A ticket the run started, with what it asked for: a refund of an order's item, or an invoice's payment.
    `control`: a negative control (run through the naive tool): the judge is expected to flag it."""
    task_id: str
    order_id: str | None = None
    item_id: str | None = None
    refund_cents: int = 0
    invoice_id: str | None = None
    payment_cents: int = 0
    control: bool = False


@dataclass(frozen=True)
class Finding:
    kind: str
    where: str
    detail: str
    tasks: tuple[str, ...]


@dataclass
class Money:
    """Per item, order or invoice: what was expected and what the provider holds."""
    where: str
    expected: int
    required: int
    moved: int
    ids: list[str]
    status: str = "as expected"


@dataclass
class Escalation:
    task_id: str
    intent_key: str
    reason: str
    asked_at: float
    settled: str | None  # what the ledger or the provider said of the intent at that moment


@dataclass
class TicketVerdict:
    ticket: Ticket
    end: EndState
    causes: list[str] = field(default_factory=list)       # escalations' and dead letters' reasons
    money: list[str] = field(default_factory=list)        # the provider ids this ticket's metadata names
    messages: dict[str, str] = field(default_factory=dict)  # party -> none / one / N identical / N different
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def flagged(self) -> bool:
        return bool(self.findings)


@dataclass
class Verdict:
    tickets: dict[str, TicketVerdict]
    items: dict[str, Money]
    orders: dict[str, Money]
    invoices: dict[str, Money]
    escalations: list[Escalation]
    findings: list[Finding]
    provider_refunds: int
    provider_payments: int

    @property
    def lost(self) -> list[str]:
        return [t for t, v in self.tickets.items() if v.end.lost]

    @property
    def flagged(self) -> set[str]:
        return {t for t, v in self.tickets.items() if v.flagged}

    @property
    def controls(self) -> set[str]:
        return {t for t, v in self.tickets.items() if v.ticket.control}

    @property
    def settled_escalations(self) -> list[Escalation]:
        return [e for e in self.escalations if e.settled]

    @property
    def ok(self) -> bool:
        """Nothing lost, exactly the controls flagged, and nobody asked about what was already settled."""
        return not self.lost and self.flagged == self.controls and not self.settled_escalations
