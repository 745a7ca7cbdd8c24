"""The verdict: what the provider and the ledger hold, weighed against what each ticket asked for.

Pure: it takes the records already read (provider.py, ledger.py, tasks.py) and returns findings.
A finding is laid on the tickets it concerns; a ticket with any finding is *flagged*. Expected
amounts come from the tickets (what they asked for), the order records (an item's price, which
payment is the order's) and the provider's own figures (what was paid), never from the effect
ledger: the ledger is one of the things being judged.

- An item is refunded at most min(price, what its tickets asked in all): "too many" above it.
  Tickets that ended `completed` say the work is done, so the item holds at least
  min(price, what the completed tickets asked): "too few" below it. A ticket that waits for a person or
  was dead-lettered is reported with its cause, not counted against the item.
- Every refund (payment) names its ticket and intent in its metadata: its amount must be its ticket's
  ask ("wrong amount"), its intent must be in the ledger as `performed` with this refund's id, and no
  intent or ticket holds two of them. A `performed` ledger row must have its refund at the provider.
- An invoice is paid once, the amount its ticket asked.
- Messages (the outbox) per ticket and party: none / one / more than one. Identical ones twice are a
  message sent twice; a completed ticket that told its customer (payee) nothing is flagged too. What a
  message says of money (claims.py) must agree with the provider: a "false message" names a reference
  the provider does not hold for the ticket, states an amount none of those has, says money moved when
  nothing did, or says none moved when the ticket's own refund (payment) is there.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from devstack.judge.claims import read
from devstack.judge.ledger import Alert, Effect, LedgerRecords, Message, OrderRow
from devstack.judge.provider import Payment, ProviderRecords, Refund
from devstack.judge.tasks import EndState
from devstack.judge.verdict import Escalation, Finding, Money, Ticket, TicketVerdict, Verdict

MONEY_TOOLS = ("issue_refund", "send_payment")
# A question of permission (may this run?) is fair about an intent that did not happen; a question of
# fact (did it happen?) is not, once the ledger or the provider already answers it.
PERMISSION_REASONS = ("approval_required",)


def weigh(tickets: list[Ticket], provider: ProviderRecords, ledger: LedgerRecords, ends: dict[str, EndState],
          asked: dict[str, float]) -> Verdict:
    """`asked`: alert key -> when the person was asked (from the histories); an alert not in it counts
    from when its row was written."""
    scale = _Scale(tickets, provider, ledger, ends)
    scale.refunds()
    scale.payments()
    scale.ledger_rows()
    scale.messages()
    escalations = scale.escalations(asked)
    for v in scale.verdicts.values():
        if v.end.lost:
            scale.find("lost", f"task {v.ticket.task_id}", f"{v.end.state} {v.end.cause}".strip(), [v.ticket.task_id])
    return Verdict(scale.verdicts, scale.items, scale.orders, scale.invoices, escalations, scale.findings,
                   provider_refunds=len(scale.scope_refunds), provider_payments=len(scale.scope_payments))


class _Scale:
    def __init__(self, tickets: list[Ticket], provider: ProviderRecords, ledger: LedgerRecords,
                 ends: dict[str, EndState]) -> None:
        self.provider, self.ledger = provider, ledger
        self.by_task = {t.task_id: t for t in tickets}
        self.verdicts = {t.task_id: TicketVerdict(t, ends.get(t.task_id, EndState("not judged"))) for t in tickets}
        self.items: dict[str, Money] = {}
        self.orders: dict[str, Money] = {}
        self.invoices: dict[str, Money] = {}
        self.findings: list[Finding] = []
        self.scope_refunds: list[Refund] = []
        self.scope_payments: list[Payment] = []

    def find(self, kind: str, where: str, detail: str, tasks: list[str]) -> None:
        finding = Finding(kind, where, detail, tuple(dict.fromkeys(t for t in tasks if t in self.verdicts)))
        self.findings.append(finding)
        for t in finding.tasks:
            self.verdicts[t].findings.append(finding)

    def completed(self, task_id: str) -> bool:
        return self.verdicts[task_id].end.state == "completed"

    # --- refunds -----------------------------------------------------------------------------

    def refunds(self) -> None:
        orders: dict[str, list[Ticket]] = defaultdict(list)
        for t in self.by_task.values():
            if t.order_id:
                orders[t.order_id].append(t)
        seen: set[str] = set()
        for order_id, tickets in sorted(orders.items()):
            tasks = [t.task_id for t in tickets]
            row = self.ledger.orders.get(order_id)
            payment = self.provider.payment(row.payment_intent_id if row else None)
            # The order's payment says whose it is (the seeding charge names the order in its metadata).
            if row is None or payment is None or payment.metadata.get("order_id", order_id) != order_id:
                self.find("order unknown", f"order {order_id}", "no order record, or its payment is not at the "
                          "provider, or is another order's", tasks)
                continue
            refunds = self.provider.refunds_of(payment)
            seen.update(r.id for r in refunds)
            self.scope_refunds += refunds
            self._order(order_id, row, payment.amount, tickets, refunds)
        # A refund that names one of the tickets but was taken from another payment.
        for r in self.provider.refunds:
            task = r.metadata.get("task_id")
            if r.moved_money and task in self.by_task and r.id not in seen:
                self.scope_refunds.append(r)
                self.find("wrong order", f"refund {r.id}", f"{r.amount} cents from {r.payment_intent or r.charge}, "
                          f"not from order {self.by_task[task].order_id}'s payment", [task])
        self._per_ticket_and_intent(self.scope_refunds)

    def _order(self, order_id: str, row: OrderRow, paid: int, tickets: list[Ticket],
               refunds: list[Refund]) -> None:
        """Each item the tickets name, then the order as a whole: its refunds against its payment."""
        tasks = [t.task_id for t in tickets]
        moved = sum(r.amount for r in refunds)
        expected = required = 0
        for item_id in sorted({t.item_id for t in tickets if t.item_id}):
            item_expected, item_required = self._item(order_id, item_id, row.price(item_id) or 0,
                                                      [t for t in tickets if t.item_id == item_id],
                                                      [r for r in refunds if r.metadata.get("item_id") == item_id])
            expected, required = expected + item_expected, required + item_required
        money = self.orders[order_id] = Money(f"order {order_id}", expected, required, moved, [r.id for r in refunds])
        # The items' findings already name their tickets; the order's status sums them up.
        money.status = "too many" if moved > expected else "too few" if moved < required else "as expected"
        stray = [r for r in refunds if r.metadata.get("item_id") not in {t.item_id for t in tickets}]
        if stray:
            money.status = "refund of no ticket's item"
            self.find(money.status, money.where, ", ".join(f"{r.id} {r.amount} cents item "
                                                             f"{r.metadata.get('item_id')}" for r in stray), tasks)
        if moved > paid:
            money.status = "beyond payment"
            self.find("beyond payment", money.where, f"{moved} cents refunded of {paid} paid", tasks)

    def _item(self, order_id: str, item_id: str, price: int, tickets: list[Ticket],
              refunds: list[Refund]) -> tuple[int, int]:
        tasks = [t.task_id for t in tickets]
        asked = sum(t.refund_cents for t in tickets)
        done = sum(t.refund_cents for t in tickets if self.completed(t.task_id))
        expected, required = min(price, asked), min(price, done)
        moved = sum(r.amount for r in refunds)
        money = self.items[f"{order_id}/{item_id}"] = Money(
            f"item {order_id}/{item_id}", expected, required, moved, [r.id for r in refunds])
        listed = ", ".join(f"{r.id} {r.amount} ({r.metadata.get('task_id')})" for r in refunds) or "none"
        if moved > expected:
            money.status = "too many"
            self.find("too many", money.where, f"{moved} cents refunded, {expected} expected: {listed}", tasks)
        elif moved < required:
            money.status = "too few"
            self.find("too few", money.where, f"{moved} cents refunded, completed tickets asked {required}: "
                      f"{listed}", tasks)
        for r in refunds:
            owner = self.by_task.get(r.metadata.get("task_id", ""))
            if owner is None or owner.item_id != item_id:
                money.status = "refund of no ticket"
                self.find("refund of no ticket", f"refund {r.id}", f"{r.amount} cents on {money.where} names "
                          f"task {r.metadata.get('task_id')!r}", tasks)
            elif r.amount != owner.refund_cents:
                money.status = "wrong amount"
                self.find("wrong amount", f"refund {r.id}", f"{r.amount} cents, {owner.task_id} asked "
                          f"{owner.refund_cents}", [owner.task_id])
        return expected, required

    # --- payments ----------------------------------------------------------------------------

    def payments(self) -> None:
        invoices: dict[str, list[Ticket]] = defaultdict(list)
        for t in self.by_task.values():
            if t.invoice_id:
                invoices[t.invoice_id].append(t)
        for invoice_id, tickets in sorted(invoices.items()):
            tasks = [t.task_id for t in tickets]
            # Payments to this invoice's payee (the invoice record names the payee at the provider) that
            # name the invoice: another payee's invoice of the same number is another invoice.
            payee = (self.ledger.invoices.get(invoice_id) or {}).get("customer_ref")
            paid = [p for p in self.provider.payments if p.moved_money and p.customer == payee
                    and p.metadata.get("invoice_id") == invoice_id]
            self.scope_payments += paid
            moved = sum(p.amount for p in paid)
            expected = max(t.payment_cents for t in tickets)  # an invoice is paid once, whoever asks
            required = max((t.payment_cents for t in tickets if self.completed(t.task_id)), default=0)
            money = self.invoices[invoice_id] = Money(f"invoice {invoice_id}", expected, required, moved,
                                                      [p.id for p in paid])
            listed = ", ".join(f"{p.id} {p.amount} ({p.metadata.get('task_id')})" for p in paid) or "none"
            if moved > expected or len(paid) > 1:
                money.status = "too many"
                self.find("too many", money.where, f"{len(paid)} payments, {moved} cents, {expected} expected: "
                          f"{listed}", tasks)
            elif moved < required:
                money.status = "too few"
                self.find("too few", money.where, f"{moved} cents paid, {required} expected: {listed}", tasks)
            for p in paid:
                owner = self.by_task.get(p.metadata.get("task_id", ""))
                if owner is not None and owner.invoice_id == invoice_id and p.amount != owner.payment_cents:
                    money.status = "wrong amount"
                    self.find("wrong amount", f"payment {p.id}", f"{p.amount} cents, {owner.task_id} asked "
                              f"{owner.payment_cents}", [owner.task_id])
        self._per_ticket_and_intent(self.scope_payments)

    # --- shared: per ticket, per intent, and the ledger --------------------------------------

    def _per_ticket_and_intent(self, moved: list[Refund] | list[Payment]) -> None:
        by_task: dict[str, list[Refund | Payment]] = defaultdict(list)
        for m in moved:
            by_task[m.metadata.get("task_id", "")].append(m)
        for task, own in by_task.items():
            if task in self.verdicts:
                self.verdicts[task].money += [m.id for m in own]
                if len(own) > 1:
                    self.find("one ticket, several", f"task {task}", f"{len(own)} at the provider: "
                              + ", ".join(f"{m.id} {m.amount}" for m in own), [task])
        for key, count in Counter(m.metadata.get("intent_key") for m in moved).items():
            if key and count > 1:
                ids = [m for m in moved if m.metadata.get("intent_key") == key]
                self.find("one intent, several", f"intent {key}", ", ".join(f"{m.id} {m.amount}" for m in ids),
                          [m.metadata.get("task_id", "") for m in ids])
        for m in moved:
            self._agrees(m)

    def _agrees(self, m: Refund | Payment) -> None:
        """The ledger holds this provider object as `performed` under its intent key."""
        key, task = m.metadata.get("intent_key"), m.metadata.get("task_id", "")
        row = self.ledger.effects.get(key or "")
        where = f"{'refund' if m.id.startswith('re_') else 'payment'} {m.id}"
        tasks = [task] if task in self.verdicts else self._tasks_of(m)
        if row is None:
            self.find("no ledger row", where, f"{m.amount} cents, intent {key!r}, task {task!r}", tasks)
        elif row.status == "performed" and row.provider_ref != m.id:
            self.find("ledger names another", where, f"intent {key} performed as {row.provider_ref}", tasks)
        elif row.status == "not_performed":
            self.find("ledger says not performed", where, f"intent {key}", tasks)
        elif row.status != "performed" and task in self.verdicts:
            # Still `intent` or `unknown`: the provider knows more than the ledger; a person has the task.
            self.verdicts[task].notes.append(f"ledger {row.status} for {m.id} ({key})")

    def _tasks_of(self, m: Refund | Payment) -> list[str]:
        """The tickets a provider object without a known ticket concerns: those of its order or invoice."""
        payment_ids = {m.payment_intent} if getattr(m, "payment_intent", None) else set()
        orders = {o for o, row in self.ledger.orders.items() if row.payment_intent_id in payment_ids}
        charges = {p.id for p in self.provider.payments if getattr(m, "charge", None) and p.charge == m.charge}
        orders |= {o for o, row in self.ledger.orders.items() if row.payment_intent_id in charges}
        invoice = m.metadata.get("invoice_id")
        return [t.task_id for t in self.by_task.values()
                if t.order_id in orders or (invoice and t.invoice_id == invoice)]

    def ledger_rows(self) -> None:
        """A `performed` money row of a ticket must have its object at the provider."""
        held = {m.id for m in self.scope_refunds + self.scope_payments}
        held |= {r.id for r in self.provider.refunds if r.moved_money}
        held |= {p.id for p in self.provider.payments if p.moved_money}
        for row in self.ledger.effects.values():
            if row.tool in MONEY_TOOLS and row.task_id in self.verdicts and row.status == "performed" \
                    and row.provider_ref not in held:
                self.find("ledger without provider", f"intent {row.intent_key}",
                          f"performed as {row.provider_ref}, which the provider does not hold", [row.task_id])

    # --- messages ----------------------------------------------------------------------------

    def messages(self) -> None:
        sent: dict[str, list] = defaultdict(list)
        for m in self.ledger.outbox:
            sent[m.task_id].append(m)
        for task, v in self.verdicts.items():
            t = v.ticket
            order = self.ledger.orders.get(t.order_id or "")
            invoice = self.ledger.invoices.get(t.invoice_id or "")
            addressee = (order.body.get("customer_email") if order else None) or \
                        (invoice.get("payee_email") if invoice else None)
            parties = (order.parties if order else set()) | ({invoice.get("payee_email")} if invoice else set())
            mine = sent.get(task, [])
            for party in sorted({addressee, *(m.recipient for m in mine)} - {None}):
                to = [m for m in mine if m.recipient == party]
                same = Counter((m.kind, m.subject, m.body) for m in to)
                v.messages[party] = ("none" if not to else "one" if len(to) == 1 else
                                     f"{len(to)}, identical" if len(same) == 1 else f"{len(to)}, different")
                if any(n > 1 for n in same.values()):
                    self.find("message sent twice", f"task {task}", f"to {party}: " + "; ".join(
                        f"{n} x {kind} {subject!r}" for (kind, subject, _), n in same.items() if n > 1), [task])
                if party not in parties:
                    self.find("message to a stranger", f"task {task}", f"{len(to)} to {party}", [task])
            if addressee and not any(m.recipient == addressee for m in mine) and v.end.state == "completed":
                self.find("told nothing", f"task {task}", f"completed without a message to {addressee}", [task])
            self._claims(t, mine)

    def _claims(self, t: Ticket, mine: list[Message]) -> None:
        """Each message's money claims (claims.py) against what the provider holds for the ticket's order
        or invoice: the references it names, its amounts, "issued" and "not issued"."""
        held = self._held_for(t)
        by_id = {m.id: m for m in held}
        own = [m for m in held if m.metadata.get("task_id") == t.task_id]
        for message in mine:
            said = read(message.body)
            wrong = [f"names {ref}, which the provider does not hold for it" for ref in said.refs if ref not in by_id]
            named = [by_id[ref] for ref in said.refs if ref in by_id] or held
            wrong += [f"states {cents / 100:.2f}, which no refund or payment it speaks of has"
                      for cents in said.amounts if cents not in {m.amount for m in named}]
            if said.done and not held:
                wrong.append("says money moved; the provider holds none for it")
            if said.denied and own:
                wrong.append(f"says no money moved; the provider holds {', '.join(m.id for m in own)}")
            if wrong:
                self.find("false message", f"task {t.task_id}", f"to {message.recipient}: " + "; ".join(wrong),
                          [t.task_id])

    def _held_for(self, t: Ticket) -> list[Refund | Payment]:
        """What moved money for the ticket at the provider: refunds of its order's item, payments of its invoice."""
        order = self.ledger.orders.get(t.order_id or "")
        payment = self.provider.payment(order.payment_intent_id) if order else None
        refunds = [r for r in self.provider.refunds_of(payment) if t.item_id is None
                   or r.metadata.get("item_id") == t.item_id] if payment else []
        payments = [p for p in self.provider.payments if p.moved_money and t.invoice_id is not None
                    and p.metadata.get("invoice_id") == t.invoice_id]
        return [*refunds, *payments]

    # --- escalations -------------------------------------------------------------------------

    def escalations(self, asked: dict[str, float]) -> list[Escalation]:
        for task, reasons in self.ledger.dead_letters.items():
            if task in self.verdicts:
                self.verdicts[task].causes += [f"dead letter: {r}" for r in reasons]
        checks = []
        for alert in self.ledger.alerts:
            if alert.task_id not in self.verdicts or alert.kind != "escalation":
                continue
            self.verdicts[alert.task_id].causes.append(f"escalation: {alert.reason}: {alert.summary}")
            if alert.intent_key:
                at = asked.get(alert.alert_key, alert.created_at)
                checks.append(Escalation(alert.task_id, alert.intent_key, alert.reason, at,
                                         self._settled_at(alert, at)))
        return checks

    def _settled_at(self, alert: Alert, at: float) -> str | None:
        """What settled the alert's intent before `at`, if anything did."""
        for m in [*self.provider.refunds, *self.provider.payments]:
            # `created` has whole seconds: the object certainly existed from created + 1 on.
            if m.moved_money and m.metadata.get("intent_key") == alert.intent_key and m.created + 1 <= at:
                return f"the provider held {m.id} from {m.created}"
        row: Effect | None = self.ledger.effects.get(alert.intent_key or "")
        if row is None or row.updated_at > at:
            return None
        if row.status == "performed" or (row.status == "not_performed" and alert.reason not in PERMISSION_REASONS):
            return f"the ledger said {row.status} since {row.updated_at:.3f}"
        return None
