"""Orders, invoices, confirmations and the outbox of messages sent to people."""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Literal, NamedTuple

from activities.db import Database, _Session
from activities.ledger import SentEffect, owner_of, record_sent
from core.domain import Invoice, Order
from core.headers import control_characters


# Rows as plain values. The provider's ids of a record are always written with it (`put_order`,
# `put_invoice`: the only writers); the columns are nullable in the schema only.
class OrderRecord(NamedTuple):
    order: Order
    customer_ref: str
    payment_intent_id: str


class InvoiceRecord(NamedTuple):
    invoice: Invoice
    customer_ref: str


class Message(NamedTuple):
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

    def forget_order(self, order_id: str) -> None:
        """Drop an order from our records (the demo's naive-tool orders): reconciliation stops listing it."""
        with self._db.connect() as conn:
            conn.execute("DELETE FROM orders WHERE order_id = :id", {"id": order_id})

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


@dataclass(frozen=True)
class Outgoing(SentEffect):
    """One message on its way to the outbox, and the intent it performs. Its owner is the attempt's
    call (activities/effects.py Attempt): its own retry finds its row."""

    kind: str
    subject: str | None
    body: str


@dataclass(frozen=True)
class MessageLimits:
    """How many messages one task may send: to any one recipient, and in all."""

    per_recipient: int = 3
    per_task: int = 6


@dataclass(frozen=True)
class Sent:
    now: bool  # this call put it in the outbox
    mine: bool  # this owner did, now or on an earlier attempt


@dataclass(frozen=True)
class OverCap:
    """Not sent: the task has sent `sent` messages already, the `cap` of its `scope`."""

    scope: Literal["recipient", "task"]
    cap: int
    sent: int


# Messages to people count towards the caps; a courier booking (kind "pickup") is not one.
CAPPED_KINDS = ("email", "seller_message")


def header_problem(message: Outgoing) -> str | None:
    """Why the message's recipient or subject cannot be a header (core/headers.py), or None."""
    for name, value in (("recipient", message.recipient), ("subject", message.subject or "")):
        found = control_characters(value)
        if found:
            return f"the {name} holds a control character ({', '.join(found[:5])})"
    return None


def send_once(db: Database, message: Outgoing, limits: MessageLimits) -> Sent | OverCap:
    """Put a message in the outbox and mark its intent performed, in one transaction.

    The outbox stands in for the mail provider and lives in the ledger's database, so the
    ledger row and the send commit together. The caps are counted in that transaction, under a
    lock of the task's outbox (SQLite's write lock; PostgreSQL's advisory lock), so two attempts
    at the boundary cannot both pass. A message already in the outbox (a retry of its intent) is
    answered as before and counts nothing.
    """
    problem = header_problem(message)
    if problem is not None:  # the argument models refuse these first: this is the last line
        raise ValueError(f"not written to the outbox: {problem}")
    now = time.time()
    with db.exclusive(f"outbox:{message.task_id}") as conn:
        known = conn.execute("SELECT 1 FROM outbox WHERE intent_key = :key", {"key": message.intent_key}).fetchone()
        if known is None and message.kind in CAPPED_KINDS:
            over = _over_cap(conn, message, limits)
            if over is not None:
                return over
        sent = conn.execute(
            "INSERT INTO outbox (intent_key, task_id, kind, recipient, subject, body, created_at)"
            " VALUES (:key, :task, :kind, :recipient, :subject, :body, :now) ON CONFLICT (intent_key) DO NOTHING",
            {"key": message.intent_key, "task": message.task_id, "kind": message.kind,
             "recipient": message.recipient, "subject": message.subject, "body": message.body,
             "now": now}).rowcount == 1
        if not sent:
            return Sent(now=False, mine=owner_of(conn, message.intent_key) == message.owner)
        record_sent(conn, message, now)
    return Sent(now=True, mine=True)


def _over_cap(conn: _Session, message: Outgoing, limits: MessageLimits) -> OverCap | None:
    """The cap one more message of the task would pass, or None."""
    kinds = ", ".join(f"'{kind}'" for kind in CAPPED_KINDS)
    row = conn.execute(
        "SELECT COUNT(*) AS total, COALESCE(SUM(CASE WHEN LOWER(recipient) = LOWER(:recipient) THEN 1 ELSE 0 END),"
        f" 0) AS to_recipient FROM outbox WHERE task_id = :task AND kind IN ({kinds})",
        {"task": message.task_id, "recipient": message.recipient}).one()
    if row["to_recipient"] >= limits.per_recipient:
        return OverCap(scope="recipient", cap=limits.per_recipient, sent=row["to_recipient"])
    if row["total"] >= limits.per_task:
        return OverCap(scope="task", cap=limits.per_task, sent=row["total"])
    return None


def upsert_confirmation(db: Database, task_id: str, order_id: str, text: str) -> None:
    with db.connect() as conn:
        conn.execute(
            "INSERT INTO confirmations (task_id, order_id, text, updated_at) VALUES (:task, :order, :text, :now)"
            " ON CONFLICT (task_id, order_id) DO UPDATE SET text = excluded.text, updated_at = excluded.updated_at",
            {"task": task_id, "order": order_id, "text": text, "now": time.time()})


def _within(db: Database, conn: _Session | None) -> AbstractContextManager[_Session]:
    """The caller's transaction when it has one, else a new one."""
    return nullcontext(conn) if conn is not None else db.connect()
