"""The ledger's database, read with plain SQL: effects, outbox, orders, invoices, alerts, dead letters.

The schema is the one migrations/ creates; the judge names the columns it reads and nothing else, so
it reads the tables as they are, not as the product's classes would present them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text


def database_url(target: str | Path) -> str:
    value = str(target)
    return value if "://" in value else f"sqlite:///{Path(value).resolve()}"


@dataclass(frozen=True)
class Effect:
    intent_key: str
    task_id: str
    tool: str
    status: str
    provider_ref: str | None
    amount_cents: int | None
    updated_at: float


@dataclass(frozen=True)
class Message:
    intent_key: str
    task_id: str
    kind: str
    recipient: str
    subject: str | None
    body: str


@dataclass(frozen=True)
class Alert:
    task_id: str
    alert_key: str
    kind: str
    reason: str
    intent_key: str | None
    summary: str
    created_at: float


@dataclass(frozen=True)
class OrderRow:
    order_id: str
    payment_intent_id: str | None
    body: dict[str, Any]

    def price(self, item_id: str) -> int | None:
        return next((i["amount_cents"] for i in self.body.get("items", []) if i["item_id"] == item_id), None)

    @property
    def item_ids(self) -> set[str]:
        return {i["item_id"] for i in self.body.get("items", [])}

    @property
    def parties(self) -> set[str]:
        """Who a ticket on this order may write to: its customer, its seller, and the courier that a
        pickup booking (outbox kind `pickup`) is addressed to."""
        return {self.body.get("customer_email"), self.body.get("seller_email"), "courier"} - {None}


@dataclass(frozen=True)
class LedgerRecords:
    effects: dict[str, Effect]
    outbox: list[Message]
    orders: dict[str, OrderRow]
    invoices: dict[str, dict[str, Any]]  # the invoice's body, and `customer_ref`: the payee at the provider
    alerts: list[Alert]
    dead_letters: dict[str, list[str]] = field(default_factory=dict)  # task -> reasons


class LedgerReader:
    def __init__(self, database: str | Path) -> None:
        self._engine = create_engine(database_url(database))

    def rows(self, sql: str) -> list[dict[str, Any]]:
        with self._engine.connect() as conn:
            return [dict(r) for r in conn.execute(text(sql)).mappings().fetchall()]

    def read(self) -> LedgerRecords:
        effects = {r["intent_key"]: Effect(r["intent_key"], r["task_id"], r["tool"], r["status"], r["provider_ref"],
                                           r["amount_cents"], r["updated_at"])
                   for r in self.rows("SELECT intent_key, task_id, tool, status, provider_ref, amount_cents,"
                                      " updated_at FROM effects")}
        outbox = [Message(r["intent_key"], r["task_id"], r["kind"], r["recipient"], r["subject"], r["body"])
                  for r in self.rows("SELECT intent_key, task_id, kind, recipient, subject, body FROM outbox"
                                     " ORDER BY created_at")]
        orders = {r["order_id"]: OrderRow(r["order_id"], r["payment_intent_id"], json.loads(r["body"]))
                  for r in self.rows("SELECT order_id, payment_intent_id, body FROM orders")}
        invoices = {r["invoice_id"]: {**json.loads(r["body"]), "customer_ref": r["customer_ref"]}
                    for r in self.rows("SELECT invoice_id, body, customer_ref FROM invoices")}
        alerts = [Alert(r["task_id"], r["alert_key"], r["kind"], r["reason"], r["intent_key"], r["summary"],
                        r["created_at"])
                  for r in self.rows("SELECT task_id, alert_key, kind, reason, intent_key, summary, created_at"
                                     " FROM alerts ORDER BY created_at")]
        dead: dict[str, list[str]] = {}
        for r in self.rows("SELECT task_id, reason FROM dead_letters ORDER BY created_at"):
            dead.setdefault(r["task_id"], []).append(r["reason"])
        return LedgerRecords(effects, outbox, orders, invoices, alerts, dead)

    def last_horizon(self) -> float:
        """The latest time (epoch seconds) at which a request the ledger knows of may still land at the
        provider: the latest settle horizon or lease of any intent."""
        row = self.rows("SELECT MAX(horizon) AS h, MAX(lease_until) AS l FROM effects")[0]
        return max(row["h"] or 0.0, row["l"] or 0.0)

    def close(self) -> None:
        self._engine.dispose()


def seconds_until_quiet(reader: LedgerReader, now: float | None = None) -> float:
    """How long until the longest settle horizon has passed (0 when it has)."""
    return max(0.0, reader.last_horizon() - (time.time() if now is None else now))
