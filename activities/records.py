"""Orders, invoices, confirmations and the outbox of messages sent to people."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from contextlib import nullcontext
from typing import ContextManager

from activities.db import Database, _Session
from core.domain import Invoice, Order


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

    @property
    def db(self) -> Database:
        return self._db

    def put_order(self, order: Order, customer_ref: str, payment_intent_id: str, conn: _Session | None = None
                  ) -> None:
        with _within(self._db, conn) as conn:
            conn.execute(
                "INSERT INTO orders (order_id, body, customer_ref, payment_intent_id) VALUES (:id, :body, :cus, :pi)"
                " ON CONFLICT (order_id) DO UPDATE SET body = excluded.body, customer_ref = excluded.customer_ref,"
                " payment_intent_id = excluded.payment_intent_id",
                {"id": order.order_id, "body": order.model_dump_json(), "cus": customer_ref, "pi": payment_intent_id})

    def order(self, order_id: str, conn: _Session | None = None) -> OrderRecord | None:
        with _within(self._db, conn) as conn:
            row = conn.execute("SELECT * FROM orders WHERE order_id = :id", {"id": order_id}).fetchone()
        if row is None:
            return None
        return OrderRecord(Order.model_validate_json(row["body"]), row["customer_ref"], row["payment_intent_id"])

    def put_invoice(self, invoice: Invoice, customer_ref: str, conn: _Session | None = None) -> None:
        with _within(self._db, conn) as conn:
            conn.execute("INSERT INTO invoices (invoice_id, body, customer_ref) VALUES (:id, :body, :cus)"
                         " ON CONFLICT (invoice_id) DO UPDATE SET body = excluded.body,"
                         " customer_ref = excluded.customer_ref",
                         {"id": invoice.invoice_id, "body": invoice.model_dump_json(), "cus": customer_ref})

    def invoice(self, invoice_id: str, conn: _Session | None = None) -> InvoiceRecord | None:
        with _within(self._db, conn) as conn:
            row = conn.execute("SELECT * FROM invoices WHERE invoice_id = :id", {"id": invoice_id}).fetchone()
        if row is None:
            return None
        return InvoiceRecord(Invoice.model_validate_json(row["body"]), row["customer_ref"])

    def messages(self, task_id: str | None = None) -> list[Message]:
        with self._db.connect() as conn:
            sql, params = "SELECT * FROM outbox", {}
            if task_id is not None:
                sql, params = sql + " WHERE task_id = :task", {"task": task_id}
            rows = conn.execute(sql + " ORDER BY created_at", params).fetchall()
        return [Message(r["intent_key"], r["task_id"], r["kind"], r["recipient"], r["subject"], r["body"])
                for r in rows]

    def confirmation(self, task_id: str, order_id: str) -> str | None:
        with self._db.connect() as conn:
            row = conn.execute("SELECT text FROM confirmations WHERE task_id = :task AND order_id = :order",
                               {"task": task_id, "order": order_id}).fetchone()
        return row["text"] if row else None


def send_once(db: Database, key: str, task_id: str, tool: str, arguments: dict, owner: str,
              kind: str, recipient: str, subject: str | None, body: str) -> tuple[bool, bool]:
    """Put a message in the outbox and mark its intent performed, in one transaction.

    The outbox stands in for the mail provider and lives in the ledger's database, so the
    ledger row and the send commit together. Returns (sent_now, sent_by_this_owner).
    """
    now = time.time()
    with db.connect() as conn:
        sent = conn.execute(
            "INSERT INTO outbox (intent_key, task_id, kind, recipient, subject, body, created_at)"
            " VALUES (:key, :task, :kind, :recipient, :subject, :body, :now) ON CONFLICT (intent_key) DO NOTHING",
            {"key": key, "task": task_id, "kind": kind, "recipient": recipient, "subject": subject, "body": body,
             "now": now}).rowcount == 1
        if not sent:
            row = conn.execute("SELECT owner FROM effects WHERE intent_key = :key", {"key": key}).fetchone()
            return False, row is not None and row["owner"] == owner
        conn.execute(
            "INSERT INTO effects (intent_key, task_id, tool, arguments, status, owner, provider_ref, detail,"
            " created_at, updated_at) VALUES (:key, :task, :tool, :args, 'performed', :owner, :ref, :detail, :now,"
            " :now) ON CONFLICT (intent_key) DO UPDATE SET status = 'performed', owner = excluded.owner,"
            " provider_ref = excluded.provider_ref, updated_at = excluded.updated_at",
            {"key": key, "task": task_id, "tool": tool, "args": json.dumps(arguments, sort_keys=True),
             "owner": owner, "ref": f"outbox:{key}", "detail": json.dumps({"recipient": recipient}), "now": now})
    return True, True


def upsert_confirmation(db: Database, task_id: str, order_id: str, text: str) -> None:
    with db.connect() as conn:
        conn.execute(
            "INSERT INTO confirmations (task_id, order_id, text, updated_at) VALUES (:task, :order, :text, :now)"
            " ON CONFLICT (task_id, order_id) DO UPDATE SET text = excluded.text, updated_at = excluded.updated_at",
            {"task": task_id, "order": order_id, "text": text, "now": time.time()})


def _within(db: Database, conn: _Session | None) -> ContextManager[_Session]:
    """The caller's transaction when it has one, else a new one."""
    return nullcontext(conn) if conn is not None else db.connect()
