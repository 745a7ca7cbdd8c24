"""The ledger's units of work on the drivers' connections (activities/db.py): all or nothing, the
connection handed back clean, the parameters each driver takes, and a result that cannot hide a column."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from activities.db import Database, _statement

ORDER = ("INSERT INTO orders (order_id, body, customer_ref, payment_intent_id) "
         "VALUES (:id, :body, :cus, :pi)")


class Boom(Exception):
    pass


def _order(n: int) -> dict[str, str]:
    return {"id": f"O-{n}", "body": "{}", "cus": "cus_1", "pi": f"pi_{n}"}


def _orders(db: Database) -> list[str]:
    with db.connect() as conn:
        return [r["order_id"] for r in conn.execute("SELECT order_id FROM orders ORDER BY order_id").fetchall()]


def test_a_unit_of_work_is_all_or_nothing_and_its_connection_goes_back_clean(tmp_path: Path):
    db = Database(tmp_path / "agent.db")
    db.create()
    with pytest.raises(Boom), db.connect() as conn:
        conn.execute(ORDER, _order(1))
        raise Boom
    # The pool has one connection idle: the one that failed. Were it still in its transaction, the next
    # unit's BEGIN IMMEDIATE on it would fail.
    with db.connect() as conn:
        assert conn.execute(ORDER, _order(2)).rowcount == 1
    with pytest.raises(sqlite3.IntegrityError), db.connect() as conn:  # the driver's own error: a duplicate key
        conn.execute(ORDER, _order(3))
        conn.execute(ORDER, _order(2))
    assert _orders(db) == ["O-2"]


def test_a_unit_of_work_holds_the_write_lock_from_its_start(tmp_path: Path):
    db = Database(tmp_path / "agent.db")
    db.create()
    other = Database(tmp_path / "agent.db")
    with db.connect():
        # Another connection cannot begin its own unit while this one is open, even before it writes.
        with other.engine.raw_connection() as raw:
            raw.driver_connection.execute("PRAGMA busy_timeout=0")
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                raw.driver_connection.execute("BEGIN IMMEDIATE")


def test_rows_come_back_by_column_name_and_a_name_twice_is_refused(tmp_path: Path):
    db = Database(tmp_path / "agent.db")
    db.create()
    with db.connect() as conn:
        conn.execute(ORDER, _order(1))
        row = conn.execute("SELECT * FROM orders WHERE order_id = :id", {"id": "O-1"}).one()
        assert row["payment_intent_id"] == "pi_1" and row["customer_ref"] == "cus_1"
        assert conn.execute("SELECT * FROM orders WHERE order_id = :id", {"id": "none"}).fetchone() is None
        with pytest.raises(LookupError):
            conn.execute("SELECT * FROM orders WHERE order_id = :id", {"id": "none"}).one()
        with pytest.raises(ValueError, match="two columns of one name"):
            conn.execute("SELECT a.order_id, b.order_id FROM orders a JOIN orders b ON a.order_id = b.order_id")


def test_parameters_are_written_as_each_driver_takes_them():
    sql = "SELECT x::text, 'a:b', :key, :k0 FROM t WHERE n LIKE '50%' AND m = :name_2"
    assert _statement(sql, pyformat=False) == sql  # sqlite3 binds :name itself
    assert _statement(sql, pyformat=True) == (
        "SELECT x::text, 'a:b', %(key)s, %(k0)s FROM t WHERE n LIKE '50%%' AND m = %(name_2)s")
