"""The database of the ledger, orders, outbox, alerts and dead letters: SQLite by default,
PostgreSQL by URL. Schema by Alembic migrations (migrations/), queries in portable SQL.

SQLite: one short-lived connection per unit of work, WAL, and `BEGIN IMMEDIATE` so a unit
of work holds the write lock from its first statement. PostgreSQL: a pooled engine; rows
that are read to be changed are locked with `FOR UPDATE` (see `lock`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.engine import Connection, CursorResult, Engine
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.pool import ConnectionPoolEntry
from sqlalchemy.sql.elements import TextClause

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


def database_url(target: str | Path) -> str:
    """A URL from a URL, or from a SQLite file path."""
    value = str(target)
    return value if "://" in value else f"sqlite:///{Path(value).resolve()}"


class _Session:
    """A connection in a transaction, with named-parameter SQL and rows as mappings."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> _Result:
        return _Result(self._conn.execute(_clause(sql), dict(params or {})))


@lru_cache(maxsize=512)
def _clause(sql: str) -> TextClause:
    """The statement of an SQL text, parsed for its bind parameters once: our statements are a fixed
    set of strings (values are always bound, never formatted in), run thousands of times each."""
    return text(sql)


# A row of our SQL text, keyed by column name. SQLAlchemy types a RowMapping's keys wider (columns, ORM
# entities): _Result narrows them, for every query, and nowhere else.
Row = Mapping[str, Any]


class _Result:
    def __init__(self, result: CursorResult[Any]) -> None:
        self._result = result
        self.rowcount = result.rowcount

    def fetchone(self) -> Row | None:
        return cast("Row | None", self._result.mappings().fetchone()) if self._result.returns_rows else None

    def one(self) -> Row:
        """The row of a query that has exactly one: an aggregate, or a row read back in the transaction
        that wrote it (NoResultFound, MultipleResultsFound otherwise)."""
        return cast(Row, self._result.mappings().one())

    def fetchall(self) -> list[Row]:
        return cast("list[Row]", list(self._result.mappings().fetchall())) if self._result.returns_rows else []


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
                engine = create_engine(self.url, connect_args={"timeout": 30, "isolation_level": None})
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
        """A transaction that commits on success and rolls back on error."""
        with self.engine.begin() as conn:
            yield _Session(conn)

    @contextmanager
    def exclusive(self, name: str) -> Iterator[_Session]:
        """A transaction that no other `exclusive(name)` runs beside, in any process.

        SQLite's write lock is already exclusive; PostgreSQL takes a transaction advisory lock.
        """
        with self.connect() as conn:
            if not self.is_sqlite:
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(:name))", {"name": name})
            yield conn


def _sqlite_pragmas(dbapi_conn: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
