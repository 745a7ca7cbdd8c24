"""The ledger's units of work on the drivers' connections (activities/db.py): all or nothing, the
connection handed back clean, the parameters each driver takes, and a result that cannot hide a column."""

from __future__ import annotations

import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from activities import db as db_module
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


def test_units_of_one_file_in_one_process_take_turns_without_sqlites_polling(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch):
    """SQLite's own wait for its write lock sleeps between tries (1, 2, 5, 10 ms and more); the units of work
    of one process wait on a lock of ours, handed over as the unit before ends. With SQLite's wait off, a
    unit begun in another thread while one is open waits for it and then runs, instead of failing."""
    monkeypatch.setattr(db_module, "_sqlite_pragmas", _without_sqlites_wait)
    db = Database(tmp_path / "agent.db")
    db.create()
    second: dict[str, Any] = {}

    def run_second() -> None:
        try:
            with db.connect() as conn:
                conn.execute(ORDER, _order(2))
            second["ran"] = True
        except Exception as err:  # what the test reports: the unit failed instead of waiting
            second["error"] = err

    with db.connect() as conn:
        conn.execute(ORDER, _order(1))
        thread = threading.Thread(target=run_second)
        thread.start()
        _poll(lambda: _waits_in_connect(thread) or not thread.is_alive(), "the second unit waiting or ended")
        assert not second, f"the second unit did not wait for the first: {second}"
    thread.join(timeout=30)
    assert second == {"ran": True}
    assert _orders(db) == ["O-1", "O-2"]


def test_a_unit_that_cannot_have_the_lock_in_time_fails_as_sqlite_would(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(db_module, "BUSY_SECONDS", 0.05)
    db = Database(tmp_path / "agent.db")
    db.create()
    failed: list[BaseException] = []

    def run_second() -> None:
        try:
            with db.connect():
                pass
        except sqlite3.OperationalError as err:
            failed.append(err)

    with db.connect():  # held until the other has given up
        thread = threading.Thread(target=run_second)
        thread.start()
        thread.join(timeout=30)
    assert [str(e) for e in failed] == ["database is locked"]
    with db.connect() as conn:  # and the lock is free again
        conn.execute(ORDER, _order(1))


def _without_sqlites_wait(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=0")
    cursor.close()


def _waits_in_connect(thread: threading.Thread) -> bool:
    """The thread's innermost Python frame is Database.connect: it waits in the lock's acquire (C code)."""
    frame = sys._current_frames().get(thread.ident or -1)
    return frame is not None and frame.f_code.co_name == "connect" and frame.f_code.co_filename == db_module.__file__


def _poll(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.005)


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
