"""Orders, invoices, confirmations and the outbox of messages sent to people."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from activities.db import Database
from core.scenarios import Invoice, Order


@dataclass(frozen=True)
class OrderRecord:
    order: Order
    customer_ref: str | None
    payment_intent_id: str | None


@dataclass(frozen=True)
class InvoiceRecord:
    invoice: Invoice
    customer_ref: str | None


@dataclass(frozen=True)
class Message:
    intent_key: str
    task_id: str
    kind: str
    recipient: str
    subject: str | None
    body: str


class Records:
    def __init__(self, db: Database) -> None:
        self._db = db

    def put_order(self, order: Order, customer_ref: str, payment_intent_id: str) -> None:
        with self._db.connect() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO orders (order_id, body, customer_ref, payment_intent_id) VALUES (?, ?, ?, ?)",
                (order.order_id, order.model_dump_json(), customer_ref, payment_intent_id))

    def order(self, order_id: str) -> OrderRecord | None:
        with self._db.connect() as conn:
            row = conn.execute("SELECT * FROM orders WHERE order_id = ?", (order_id,)).fetchone()
        if row is None:
            return None
        return OrderRecord(Order.model_validate_json(row["body"]), row["customer_ref"], row["payment_intent_id"])

    def put_invoice(self, invoice: Invoice, customer_ref: str) -> None:
        with self._db.connect() as conn:
            conn.execute("INSERT OR REPLACE INTO invoices (invoice_id, body, customer_ref) VALUES (?, ?, ?)",
                         (invoice.invoice_id, invoice.model_dump_json(), customer_ref))

    def invoice(self, invoice_id: str) -> InvoiceRecord | None:
        with self._db.connect() as conn:
            row = conn.execute("SELECT * FROM invoices WHERE invoice_id = ?", (invoice_id,)).fetchone()
        if row is None:
            return None
        return InvoiceRecord(Invoice.model_validate_json(row["body"]), row["customer_ref"])

    def messages(self, task_id: str | None = None) -> list[Message]:
        with self._db.connect() as conn:
            sql, params = "SELECT * FROM outbox", ()
            if task_id is not None:
                sql, params = sql + " WHERE task_id = ?", (task_id,)
            rows = conn.execute(sql + " ORDER BY created_at", params).fetchall()
        return [Message(r["intent_key"], r["task_id"], r["kind"], r["recipient"], r["subject"], r["body"])
                for r in rows]

    def confirmation(self, task_id: str, order_id: str) -> str | None:
        with self._db.connect() as conn:
            row = conn.execute("SELECT text FROM confirmations WHERE task_id = ? AND order_id = ?",
                               (task_id, order_id)).fetchone()
        return row["text"] if row else None


def send_once(db: Database, key: str, task_id: str, tool: str, arguments: dict, owner: str,
              kind: str, recipient: str, subject: str | None, body: str) -> tuple[bool, bool]:
    """Put a message in the outbox and mark its intent performed, in one transaction.

    The outbox stands in for the mail provider and lives in the ledger's database, so the
    ledger row and the send commit together. Returns (sent_now, sent_by_this_owner).
    """
    now = time.time()
    with db.connect() as conn:
        row = conn.execute("SELECT status, owner FROM effects WHERE intent_key = ?", (key,)).fetchone()
        if row is not None and row["status"] == "performed":
            return False, row["owner"] == owner
        conn.execute(
            "INSERT OR IGNORE INTO outbox (intent_key, task_id, kind, recipient, subject, body, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)", (key, task_id, kind, recipient, subject, body, now))
        conn.execute(
            "INSERT INTO effects (intent_key, task_id, tool, arguments, status, owner, provider_ref, detail,"
            " created_at, updated_at) VALUES (?, ?, ?, ?, 'performed', ?, ?, ?, ?, ?)"
            " ON CONFLICT(intent_key) DO UPDATE SET status = 'performed', owner = excluded.owner,"
            " provider_ref = excluded.provider_ref, updated_at = excluded.updated_at",
            (key, task_id, tool, json.dumps(arguments, sort_keys=True), owner, f"outbox:{key}",
             json.dumps({"recipient": recipient}), now, now))
    return True, True


def upsert_confirmation(db: Database, task_id: str, order_id: str, text: str) -> None:
    with db.connect() as conn:
        conn.execute(
            "INSERT INTO confirmations (task_id, order_id, text, updated_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT(task_id, order_id) DO UPDATE SET text = excluded.text, updated_at = excluded.updated_at",
            (task_id, order_id, text, time.time()))
