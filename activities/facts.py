"""`check_facts`: a ticket's facts against our records and the provider, before its task starts.

An order must be in the ledger's records with its payment succeeded at the provider, and every
item the facts name must be one of its items; an invoice must be in our records with its payee
known to the provider. The starter runs this as a standalone activity (client/facts.py).
"""

from __future__ import annotations

from temporalio import activity

from activities.db import Database
from activities.effects import PROVIDER_ERRORS, describe
from activities.payments import StripeGateway
from activities.records import Records
from activities.tools import in_thread
from core.facts import CHECK_FACTS_ACTIVITY, FactsCheck, FactsVerdict
from core.kinds import fact_values


class FactActivities:
    def __init__(self, db: Database, gateway: StripeGateway) -> None:
        self._records = Records(db)
        self._gateway = gateway

    @activity.defn(name=CHECK_FACTS_ACTIVITY)
    async def check_facts(self, check: FactsCheck) -> FactsVerdict:
        return await in_thread(self._check, check)

    def _check(self, check: FactsCheck) -> FactsVerdict:
        problems: list[str] = []
        try:
            for order_id in fact_values(check.facts, "order_id"):
                problems += self._order(order_id, fact_values(check.facts, "item_id"))
            for invoice_id in fact_values(check.facts, "invoice_id"):
                problems += self._invoice(invoice_id)
        except PROVIDER_ERRORS as err:
            problems.append(f"cannot read the payment provider to check the ticket's facts: {describe(err)}")
        return FactsVerdict(problems=problems)

    def _order(self, order_id: str, item_ids: tuple[str, ...]) -> list[str]:
        record = self._records.order(order_id)
        if record is None:
            return [f"no order {order_id} in our records"]
        problems = []
        if not self._gateway.payment_exists(record.payment_intent_id):
            problems.append(f"order {order_id}: the provider holds no succeeded payment "
                            f"{record.payment_intent_id}")
        known = {item.item_id for item in record.order.items}
        problems += [f"order {order_id} has no item {item} (its items: {', '.join(sorted(known))})"
                     for item in item_ids if item not in known]
        return problems

    def _invoice(self, invoice_id: str) -> list[str]:
        record = self._records.invoice(invoice_id)
        if record is None:
            return [f"no invoice {invoice_id} in our records"]
        if not self._gateway.customer_exists(record.customer_ref):
            return [f"invoice {invoice_id}: the provider does not know its payee {record.customer_ref}"]
        return []
