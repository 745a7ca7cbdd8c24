"""SQLite storage for the effect ledger, the orders and the local outbox.

One short-lived connection per unit of work: activities run concurrently in threads and
WAL lets readers proceed while one writer commits.
"""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

_SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    intent_key   TEXT PRIMARY KEY,
    task_id      TEXT NOT NULL,
    tool         TEXT NOT NULL,
    arguments    TEXT NOT NULL,
    status       TEXT NOT NULL CHECK (status IN ('intent', 'performed', 'not_performed', 'unknown')),
    owner        TEXT NOT NULL,
    lease_until  REAL NOT NULL DEFAULT 0,
    provider_ref TEXT,
    amount_cents INTEGER,
    detail       TEXT,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS orders (
    order_id          TEXT PRIMARY KEY,
    body              TEXT NOT NULL,
    customer_ref      TEXT,
    payment_intent_id TEXT
);
CREATE TABLE IF NOT EXISTS invoices (
    invoice_id   TEXT PRIMARY KEY,
    body         TEXT NOT NULL,
    customer_ref TEXT
);
CREATE TABLE IF NOT EXISTS outbox (
    intent_key TEXT PRIMARY KEY,
    task_id    TEXT NOT NULL,
    kind       TEXT NOT NULL,
    recipient  TEXT NOT NULL,
    subject    TEXT,
    body       TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS alerts (
    alert_key  TEXT PRIMARY KEY,
    task_id    TEXT NOT NULL,
    kind       TEXT NOT NULL,
    reason     TEXT NOT NULL,
    intent_key TEXT,
    summary    TEXT NOT NULL,
    delivered  TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS dead_letters (
    task_id     TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    reason      TEXT NOT NULL,
    checkpoint  TEXT NOT NULL,
    created_at  REAL NOT NULL,
    redriven_at REAL,
    PRIMARY KEY (task_id, run_id)
);
CREATE TABLE IF NOT EXISTS reconciliations (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at REAL NOT NULL,
    findings   INTEGER NOT NULL,
    report     TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS confirmations (
    task_id    TEXT NOT NULL,
    order_id   TEXT NOT NULL,
    text       TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (task_id, order_id)
);
"""


class Database:
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def create(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=30)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)
        finally:
            conn.close()

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        """A connection whose transaction commits on success and rolls back on error."""
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA busy_timeout=30000")
        conn.execute("PRAGMA synchronous=NORMAL")
        try:
            conn.execute("BEGIN IMMEDIATE")
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        finally:
            conn.close()
