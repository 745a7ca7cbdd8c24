"""The effect ledger: one row per intent key, enforced by the primary key.

Row `intent` is written before the provider call and `performed` after it; a row left at
`intent` means "maybe happened" and must be verified with the provider, never guessed.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from activities.db import Database


@dataclass(frozen=True)
class Effect:
    intent_key: str
    task_id: str
    tool: str
    status: str
    owner: str
    lease_until: float
    provider_ref: str | None
    amount_cents: int | None
    detail: dict[str, Any]
    updated_at: float

    @classmethod
    def from_row(cls, row) -> "Effect":
        return cls(
            intent_key=row["intent_key"], task_id=row["task_id"], tool=row["tool"], status=row["status"],
            owner=row["owner"], lease_until=row["lease_until"], provider_ref=row["provider_ref"],
            amount_cents=row["amount_cents"], detail=json.loads(row["detail"] or "{}"),
            updated_at=row["updated_at"],
        )


@dataclass(frozen=True)
class Claim:
    """The ledger row as this attempt found it; `fresh` when this attempt created it."""

    effect: Effect
    fresh: bool
    previous_status: str | None
    previous_owner: str | None


class EffectLedger:
    def __init__(self, db: Database) -> None:
        self._db = db

    def claim(self, key: str, task_id: str, tool: str, arguments: dict, owner: str, lease_seconds: float) -> Claim:
        """Record the intent, or return the existing row, taking it over when its lease expired."""
        now = time.time()
        with self._db.connect() as conn:
            inserted = conn.execute(
                "INSERT INTO effects (intent_key, task_id, tool, arguments, status, owner, lease_until,"
                " created_at, updated_at) VALUES (:key, :task, :tool, :args, 'intent', :owner, :lease, :now, :now)"
                " ON CONFLICT (intent_key) DO NOTHING",
                {"key": key, "task": task_id, "tool": tool, "args": json.dumps(arguments, sort_keys=True),
                 "owner": owner, "lease": now + lease_seconds, "now": now},
            ).rowcount == 1
            row = conn.execute("SELECT * FROM effects WHERE intent_key = :key" + self._db.lock, {"key": key}).fetchone()
            previous = None if inserted else row["status"]
            previous_owner = None if inserted else row["owner"]
            if not inserted and row["status"] != "performed" and row["lease_until"] <= now:
                conn.execute(
                    "UPDATE effects SET status = 'intent', owner = :owner, lease_until = :lease, updated_at = :now"
                    " WHERE intent_key = :key", {"owner": owner, "lease": now + lease_seconds, "now": now, "key": key})
                row = conn.execute("SELECT * FROM effects WHERE intent_key = :key", {"key": key}).fetchone()
        return Claim(Effect.from_row(row), inserted, previous, previous_owner)

    def performed(self, key: str, provider_ref: str, amount_cents: int | None, detail: dict[str, Any]) -> None:
        self._set(key, "performed", provider_ref, amount_cents, detail)

    def not_performed(self, key: str, detail: dict[str, Any]) -> None:
        self._set(key, "not_performed", None, None, detail)

    def unknown(self, key: str, detail: dict[str, Any]) -> None:
        self._set(key, "unknown", None, None, detail)

    def release(self, key: str, owner: str) -> None:
        """The holder will not send: let the next attempt go on without waiting for the lease."""
        with self._db.connect() as conn:
            conn.execute("UPDATE effects SET lease_until = 0 WHERE intent_key = :key AND owner = :owner",
                         {"key": key, "owner": owner})

    def get(self, key: str) -> Effect | None:
        with self._db.connect() as conn:
            row = conn.execute("SELECT * FROM effects WHERE intent_key = :key", {"key": key}).fetchone()
        return Effect.from_row(row) if row else None

    def all(self) -> list[Effect]:
        with self._db.connect() as conn:
            rows = conn.execute("SELECT * FROM effects ORDER BY created_at").fetchall()
        return [Effect.from_row(r) for r in rows]

    def _set(self, key: str, status: str, ref: str | None, amount: int | None, detail: dict[str, Any]) -> None:
        with self._db.connect() as conn:
            conn.execute(
                "UPDATE effects SET status = :status, provider_ref = COALESCE(:ref, provider_ref),"
                " amount_cents = COALESCE(:amount, amount_cents), detail = :detail, lease_until = 0,"
                " updated_at = :now WHERE intent_key = :key",
                {"status": status, "ref": ref, "amount": amount, "detail": json.dumps(detail, sort_keys=True),
                 "now": time.time(), "key": key},
            )
