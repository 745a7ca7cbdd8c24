"""What actually happened, read from the provider and our stores (for the starter and tests)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from activities.db import Database
from activities.ledger import EffectLedger
from activities.payments import StripeGateway, intent_key_of, metadata_of
from activities.records import Records


class World:
    def __init__(self, db: Database, gateway: StripeGateway) -> None:
        self.records = Records(db)
        self.ledger = EffectLedger(db)
        self.gateway = gateway

    def refunds(self, order_id: str) -> list[dict[str, Any]]:
        record = self.records.order(order_id)
        if record is None:
            return []
        return [{"id": r.id, "amount_cents": r.amount, "status": r.status,
                 "intent_key": intent_key_of(r), "item_id": metadata_of(r).get("item_id"),
                 "task_id": metadata_of(r).get("task_id")}
                for r in self.gateway.refunds(record.payment_intent_id)]

    def payments(self, invoice_id: str) -> list[dict[str, Any]]:
        record = self.records.invoice(invoice_id)
        if record is None:
            return []
        return [{"id": p.id, "amount_cents": p.amount, "status": p.status,
                 "intent_key": intent_key_of(p)}
                for p in self.gateway.payments_to(record.customer_ref)
                if metadata_of(p).get("invoice_id") == invoice_id]

    def messages(self, task_id: str) -> list[dict[str, Any]]:
        return [m._asdict() for m in self.records.messages(task_id)]

    def effects(self, task_id: str | None = None) -> list[dict[str, Any]]:
        return [asdict(e) for e in self.ledger.all() if task_id is None or e.task_id == task_id]

    def summary(self, task_id: str, order_id: str | None, invoice_id: str | None) -> dict[str, Any]:
        return {
            "refunds": self.refunds(order_id) if order_id else [],
            "payments": self.payments(invoice_id) if invoice_id else [],
            "messages": self.messages(task_id),
            "ledger": [{k: e[k] for k in ("intent_key", "tool", "status", "provider_ref")}
                       for e in self.effects(task_id)],
        }
