"""The database of the ledger, orders, outbox, alerts and dead letters: SQLite by default,
PostgreSQL by URL. Schema by Alembic migrations (migrations/), queries in portable SQL.

SQLite: a pooled connection per unit of work, WAL, and `BEGIN IMMEDIATE` so a unit of work
holds the write lock from its first statement; within a process the units of one file take turns on
a lock of ours first (`_writer`). PostgreSQL: a pooled engine; rows that are read
to be changed are locked with `FOR UPDATE` (see `lock`). SQLAlchemy keeps the pools and runs the
migrations; statements go to the drivers themselves (`_Session`).
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import Engine
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.pool import ConnectionPoolEntry

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"
# How long a unit of work waits for SQLite's write lock: ours, then SQLite's own (busy_timeout).
BUSY_SECONDS = 30


def database_url(target: str | Path) -> str:
    """A URL from a URL, or from a SQLite file path."""
    value = str(target)
    return value if "://" in value else f"sqlite:///{Path(value).resolve()}"


class _Session:
    """A transaction on one of the pool's driver connections, with named-parameter SQL and rows as mappings.

    Statements go to the driver (sqlite3, psycopg) directly: SQLAlchemy's execution layer cost about
    170 microseconds per unit of work and 65 per statement in a thread holding the GIL, ten times what
    the driver itself takes, and a refund runs about ten units and thirty statements. SQLAlchemy keeps
    the pool, the connection set-up and the migrations."""

    def __init__(self, cursor: Any, pyformat: bool) -> None:
        self._cursor = cursor
        self._pyformat = pyformat

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> _Result:
        self._cursor.execute(_statement(sql, self._pyformat), dict(params or {}))
        return _Result(self._cursor)


_NAME = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


@lru_cache(maxsize=512)
def _statement(sql: str, pyformat: bool) -> str:
    """Our SQL names its parameters `:name`, which sqlite3 takes as written; psycopg takes `%(name)s`
    (and a literal % doubled). Our statements are a fixed set of strings (values are always bound,
    never formatted in), run thousands of times each, so each is rewritten once."""
    return _NAME.sub(r"%(\1)s", sql.replace("%", "%%")) if pyformat else sql


# A row of our SQL text, keyed by column name.
Row = Mapping[str, Any]


class _Result:
    """The rows of one statement, read in full when it ran: the session's next statement reuses the cursor."""

    def __init__(self, cursor: Any) -> None:
        self.rowcount: int = cursor.rowcount
        columns = [column[0] for column in cursor.description] if cursor.description else None
        if columns is not None and len(set(columns)) != len(columns):  # a join's `*`: one would hide the other
            raise ValueError(f"a result has two columns of one name: {columns}")
        self._rows: list[Row] = [] if columns is None else [dict(zip(columns, row, strict=True))
                                                             for row in cursor.fetchall()]

    def fetchone(self) -> Row | None:
        """The first row (it does not advance: read many rows with fetchall)."""
        return self._rows[0] if self._rows else None

    def one(self) -> Row:
        """The row of a query that has exactly one: an aggregate, or a row read back in the transaction
        that wrote it."""
        if len(self._rows) != 1:
            raise LookupError(f"expected exactly one row, got {len(self._rows)}")
        return self._rows[0]

    def fetchall(self) -> list[Row]:
        return list(self._rows)


class Database:
    def __init__(self, target: str | Path) -> None:
        self.url = database_url(target)
        self.is_sqlite = self.url.startswith("sqlite")
        self._engine: Engine | None = None

    @property
    def path(self) -> Path | None:
        return Path(self.url.removeprefix("sqlite:///")) if self.is_sqlite else None

    @property
    def lock(self) -> str:
        """Appended to a SELECT of rows about to change: SQLite already holds the write lock."""
        return "" if self.is_sqlite else " FOR UPDATE"

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            path = self.path
            if path is not None:  # SQLite
                path.parent.mkdir(parents=True, exist_ok=True)
                engine = create_engine(self.url, connect_args={"timeout": BUSY_SECONDS, "isolation_level": None})
                event.listen(engine, "connect", _sqlite_pragmas)
                event.listen(engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))
            else:
                engine = create_engine(self.url, pool_pre_ping=True, pool_size=10, max_overflow=20)
            self._engine = engine
        return self._engine

    def create(self) -> None:
        """Bring the schema to the newest migration."""
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with self.engine.begin() as conn:
            config.attributes["connection"] = conn
            tables = set(inspect(conn).get_table_names())
            if "effects" in tables and "alembic_version" not in tables:
                command.stamp(config, "0001")  # a file made before migrations: its schema is 0001's
            command.upgrade(config, "head")

    @contextmanager
    def connect(self) -> Iterator[_Session]:
        """A transaction that commits on success and rolls back on error. SQLite's begins with
        `BEGIN IMMEDIATE` (its driver is in autocommit mode, see `engine`); psycopg's with its first
        statement. A connection that cannot even roll back (its server went away) is dropped from the
        pool instead of being handed to the next unit of work."""
        writer = _writer(self.url) if self.is_sqlite else None
        if writer is not None and not writer.acquire(timeout=BUSY_SECONDS):
            raise sqlite3.OperationalError("database is locked")  # as SQLite says when its own wait ends
        try:
            pooled = self.engine.raw_connection()
            try:
                cursor = pooled.cursor()
                if writer is not None:
                    cursor.execute("BEGIN IMMEDIATE")
                yield _Session(cursor, pyformat=writer is None)
                cursor.close()
                pooled.commit()
            except BaseException:
                # The cursor is left to be collected: closing it on a connection that failed could raise in
                # place of the error that matters.
                try:
                    pooled.rollback()
                except Exception:
                    pooled.invalidate()
                raise
            finally:
                pooled.close()  # back to the pool (an invalidated one is gone from it already)
        finally:
            if writer is not None:
                writer.release()

    @contextmanager
    def exclusive(self, name: str) -> Iterator[_Session]:
        """A transaction that no other `exclusive(name)` runs beside, in any process.

        SQLite's write lock is already exclusive; PostgreSQL takes a transaction advisory lock.
        """
        with self.connect() as conn:
            if not self.is_sqlite:
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(:name))", {"name": name})
            yield conn


_WRITERS: dict[str, threading.Lock] = {}
_WRITERS_GUARD = threading.Lock()


def _writer(url: str) -> threading.Lock:
    """The lock the units of work of one SQLite file take turns on in this process. Every unit takes
    SQLite's write lock (`BEGIN IMMEDIATE`), so they run one at a time anyway; but SQLite's wait for it
    polls, sleeping 1, 2, 5, 10 ms and more between tries, and under load a unit slept on in a thread
    of the pool long after the lock was free (16 such sleeps a ticket, 200 tickets at once in one
    worker). This lock hands over at once. Other processes on the same file still meet SQLite's own wait."""
    with _WRITERS_GUARD:
        return _WRITERS.setdefault(url, threading.Lock())


def _sqlite_pragmas(dbapi_conn: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
