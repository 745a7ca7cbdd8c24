"""The effect ledger: one row per intent key, a fenced state machine, and budgets across tasks.

    intent -> performed        (final)
    intent -> not_performed    (nothing happened; a later claim may take it again)
    intent -> unknown          (a human decides)

Every claim of an intent bumps its `fence`; every transition names the fence it holds and the
state it expects, so a write from an attempt that lost the intent (a paused worker waking up)
changes nothing. A claim that holds nothing yet is fenced by its ask: `effect_asks` keeps, per intent
and caller (a task's workflow), the latest ask (its generation: when Temporal scheduled the call) and
attempt that touched the intent, and an attempt of an older ask, or an older attempt of the same ask,
claims nothing: its caller has moved on, whatever was settled since. The claim also reserves the
intent's amount against business resources (an order item, an order, an invoice) in the same
transaction: an item is refunded at most its price and an invoice paid once, whatever the number of
tickets, tasks or calls.

SQLite: the unit of work holds the write lock from its first statement (`BEGIN IMMEDIATE`).
PostgreSQL: the budget rows and the intent row are locked `FOR UPDATE`, in a fixed order.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from activities.db import Database, Row, _Session

log = logging.getLogger("agent.ledger")

LIVE = ("intent", "performed", "unknown")  # statuses whose amounts count against a budget
_LIVE_SQL = "(" + ", ".join(f"'{status}'" for status in LIVE) + ")"


@dataclass(frozen=True)
class Effect:
    intent_key: str
    task_id: str
    tool: str
    status: str
    owner: str
    attempt: int
    fence: int
    lease_until: float
    horizon: float
    provider_ref: str | None
    amount_cents: int | None
    detail: dict[str, Any]
    updated_at: float
    sent_at: float | None = None  # when a request of it may have left for the provider; None: none ever did
    answered_at: float | None = None  # when the provider last answered one (an error too)

    @property
    def unanswered(self) -> bool:
        """Its latest request may have left and got no answer: it may be anywhere, and land late."""
        return self.sent_at is not None and (self.answered_at is None or self.answered_at < self.sent_at)

    @classmethod
    def from_row(cls, row: Row) -> Effect:
        return cls(
            intent_key=row["intent_key"], task_id=row["task_id"], tool=row["tool"], status=row["status"],
            owner=row["owner"], attempt=row["attempt"], fence=row["fence"], lease_until=row["lease_until"],
            horizon=row["horizon"], provider_ref=row["provider_ref"], amount_cents=row["amount_cents"],
            detail=json.loads(row["detail"] or "{}"), updated_at=row["updated_at"], sent_at=row["sent_at"],
            answered_at=row["answered_at"],
        )


def item_resource(order_id: str, item_id: str) -> str:
    """The budget of one item of an order: its price, refunded at most once over."""
    return f"item:{order_id}/{item_id}"


def order_resource(order_id: str) -> str:
    return f"order:{order_id}"


def invoice_resource(invoice_id: str) -> str:
    return f"invoice:{invoice_id}"


@dataclass(frozen=True)
class Hold:
    """An intent's amount reserved against one business resource, e.g. `item:ORD-8841/mugs-02`."""

    resource: str
    limit_cents: int
    amount_cents: int


@dataclass(frozen=True)
class Intent:
    """Which effect, for which task and tool call, and who holds it: what every ledger write names."""

    intent_key: str
    task_id: str
    tool: str
    arguments: dict[str, Any]
    owner: str


@dataclass(frozen=True)
class Request(Intent):
    """What a claim asks for: the intent, the attempt, its holds and the approval ceiling."""

    attempt: int
    amount_cents: int
    holds: tuple[Hold, ...]
    lease_until: float
    horizon: float
    ceiling_cents: int | None = None
    approved: bool = False
    external_cents: dict[str, int] = field(default_factory=dict)
    takeover_after_lease: bool = False  # the provider honours keys: a resend of the same key cannot pay twice
    caller: str | None = None  # the task's workflow: asks are ordered within one caller
    generation: float | None = None  # the ask: when the call was scheduled (later asks, higher)


@dataclass(frozen=True)
class HumanWord:
    """A person's verified decision on an intent, as the ledger records it."""

    intent_key: str
    status: str
    ref: str | None
    amount_cents: int | None
    detail: dict[str, Any]
    task_id: str
    tool: str
    arguments: dict[str, Any]
    owner: str
    resources: tuple[str, ...] = ()  # the intent's: a "performed" holds its amount against each


@dataclass(frozen=True)
class Claimed:
    """This attempt holds the intent under `fence` and may send until `effect.lease_until`."""

    effect: Effect
    previous: Effect | None


@dataclass(frozen=True)
class Settled:
    """The ledger already holds the intent as performed."""

    effect: Effect


@dataclass(frozen=True)
class Doubtful:
    """The intent's outcome is unknown: only a human moves it on."""

    effect: Effect


@dataclass(frozen=True)
class MayLandLate:
    """The provider ignores keys, an earlier request of the intent left and got no answer, and past its
    horizon the provider shows nothing of it: sending again would pay twice if that request lands late (a provider
    breaking the window it promised). The claim made the intent `unknown`: a person decides."""

    effect: Effect


@dataclass(frozen=True)
class Superseded:
    """A later attempt of the same call, or a later ask of the same caller, has touched the intent: this
    one is a paused or timed-out attempt that woke up after Temporal and its workflow moved on, and must
    send nothing."""

    effect: Effect | None
    why: str


@dataclass(frozen=True)
class Busy:
    """Another attempt holds the intent and a request of it may still land until `until`."""

    effect: Effect
    until: float


@dataclass(frozen=True)
class OverBudget:
    """The resource cannot take the amount: what holds it, and how much is left."""

    resource: str
    limit_cents: int
    available_cents: int
    holders: list[Effect]
    external_cents: int

    @property
    def in_flight(self) -> bool:
        return any(h.status == "intent" for h in self.holders)

    @property
    def in_doubt(self) -> bool:
        return any(h.status == "unknown" for h in self.holders)


@dataclass(frozen=True)
class NeedsApproval:
    """Refunded in total with this call, a task, an item or an order passes the ceiling."""

    scope: str
    total_cents: int
    ceiling_cents: int


Claim = Claimed | Settled | Doubtful | MayLandLate | Superseded | Busy | OverBudget | NeedsApproval


class EffectLedger:
    def __init__(self, db: Database, clock: Callable[[], float] = time.time) -> None:
        """`clock` gives epoch seconds: the wall clock, or a simulator's (devstack/sim)."""
        self._db = db
        self._clock = clock

    # --- claim ----------------------------------------------------------------------------

    def claim(self, request: Request, now: float | None = None) -> Claim:
        """Record the intent and reserve its amounts, or say why this attempt may not send."""
        now = self._clock() if now is None else now
        with self._db.connect() as conn:
            self._lock_budgets(conn, request.holds)
            row = conn.execute("SELECT * FROM effects WHERE intent_key = :key" + self._db.lock,
                               {"key": request.intent_key}).fetchone()
            previous = Effect.from_row(row) if row else None
            newer = self._newer_ask(conn, request)
            if previous is not None:
                if previous.status == "performed":
                    return Settled(previous)
                if previous.status == "unknown":
                    return Doubtful(previous)
            if newer is not None:
                # Found by devstack/sim: an attempt of an earlier ask, paused before its claim, woke after a
                # later ask (or the workflow's reading of the world) settled the intent, and sent again.
                return Superseded(previous, newer)
            if previous is not None:
                if previous.owner == request.owner and previous.attempt > request.attempt:
                    return Superseded(previous, f"attempt {previous.attempt} of this call has run since")
                if previous.status == "intent":
                    # A holder whose request never got as far as leaving can send nothing once its send-by
                    # time (its lease) has passed: the send-by check stops it.
                    left = previous.sent_at is not None
                    until = previous.horizon if left and not request.takeover_after_lease else previous.lease_until
                    if until > now:
                        return Busy(previous, until)
                    if previous.unanswered and not request.takeover_after_lease:
                        return MayLandLate(self._in_doubt(conn, previous, now))
            refusal = self._check_budgets(conn, request) or self._check_ceiling(conn, request)
            if refusal is not None:
                return refusal
            # Taking over a holder's lease (a provider that honours keys) keeps its horizon if later: its
            # request may still land until then (found by devstack/sim).
            horizon = max(request.horizon, previous.horizon) if previous is not None and previous.status == "intent" \
                else request.horizon
            params = {"key": request.intent_key, "task": request.task_id, "tool": request.tool,
                      "args": json.dumps(request.arguments, sort_keys=True), "owner": request.owner,
                      "attempt": request.attempt, "lease": request.lease_until, "horizon": horizon,
                      "amount": request.amount_cents, "now": now}
            if previous is None:
                conn.execute(
                    "INSERT INTO effects (intent_key, task_id, tool, arguments, status, owner, attempt, fence,"
                    " lease_until, horizon, amount_cents, detail, created_at, updated_at) VALUES (:key, :task, :tool,"
                    " :args, 'intent', :owner, :attempt, 1, :lease, :horizon, :amount, '{}', :now, :now)", params)
            else:
                conn.execute(
                    "UPDATE effects SET status = 'intent', owner = :owner, attempt = :attempt, fence = fence + 1,"
                    " lease_until = :lease, horizon = :horizon, amount_cents = :amount, updated_at = :now"
                    " WHERE intent_key = :key", params)
            for hold in request.holds:
                conn.execute(
                    "INSERT INTO holds (intent_key, resource, amount_cents) VALUES (:key, :resource, :amount)"
                    " ON CONFLICT (intent_key, resource) DO UPDATE SET amount_cents = excluded.amount_cents",
                    {"key": request.intent_key, "resource": hold.resource, "amount": hold.amount_cents})
            effect = Effect.from_row(conn.execute("SELECT * FROM effects WHERE intent_key = :key",
                                                  {"key": request.intent_key}).one())
        return Claimed(effect, previous)

    def _in_doubt(self, conn: _Session, effect: Effect, now: float) -> Effect:
        detail = {"reason": "may_land_late", "message": "a request of it left and got no answer, and the provider,"
                  " which ignores keys, shows nothing of it past its horizon"}
        conn.execute("UPDATE effects SET status = 'unknown', detail = :detail, updated_at = :now"
                     " WHERE intent_key = :key", {"key": effect.intent_key, "now": now,
                                                  "detail": json.dumps(detail, sort_keys=True)})
        return Effect.from_row(conn.execute("SELECT * FROM effects WHERE intent_key = :key",
                                            {"key": effect.intent_key}).one())

    def _newer_ask(self, conn: _Session, request: Request) -> str | None:
        """Record this attempt as its caller's latest on the intent, unless a later ask or attempt of the
        caller has touched the intent already: then say which."""
        if request.caller is None or request.generation is None:
            return None
        latest = self._advance(conn, request.intent_key, request.caller, request.generation, request.attempt)
        if (latest["generation"], latest["attempt"]) <= (request.generation, request.attempt):
            return None
        if latest["generation"] > request.generation:
            return f"a later ask of this call (scheduled at {latest['generation']:.3f}) has touched the intent since"
        return f"attempt {latest['attempt']} of this call has run since"

    def _advance(self, conn: _Session, key: str, caller: str, generation: float, attempt: int) -> Row:
        conn.execute(
            "INSERT INTO effect_asks (intent_key, caller, generation, attempt, updated_at) VALUES (:key, :caller,"
            " :generation, :attempt, :now) ON CONFLICT (intent_key, caller) DO UPDATE SET generation ="
            " excluded.generation, attempt = excluded.attempt, updated_at = excluded.updated_at"
            " WHERE effect_asks.generation < excluded.generation OR (effect_asks.generation = excluded.generation"
            " AND effect_asks.attempt < excluded.attempt)",
            {"key": key, "caller": caller, "generation": generation, "attempt": attempt, "now": self._clock()})
        return conn.execute("SELECT generation, attempt FROM effect_asks WHERE intent_key = :key AND caller = :caller",
                            {"key": key, "caller": caller}).one()

    def advance(self, key: str, caller: str, generation: float) -> None:
        """A later step of the caller's workflow on the intent (reading the world, a person's word): every
        attempt of an earlier ask is stale from now on and claims nothing."""
        with self._db.connect() as conn:
            self._advance(conn, key, caller, generation, 0)

    def _lock_budgets(self, conn: _Session, holds: tuple[Hold, ...]) -> None:
        for hold in sorted(holds, key=lambda h: h.resource):
            conn.execute("INSERT INTO budgets (resource, limit_cents) VALUES (:resource, :limit)"
                         " ON CONFLICT (resource) DO UPDATE SET limit_cents = excluded.limit_cents",
                         {"resource": hold.resource, "limit": hold.limit_cents})
            conn.execute("SELECT resource FROM budgets WHERE resource = :resource" + self._db.lock,
                         {"resource": hold.resource})

    def _check_budgets(self, conn: _Session, request: Request) -> OverBudget | None:
        for hold in request.holds:
            rows = conn.execute(
                "SELECT e.*, h.amount_cents AS held FROM holds h JOIN effects e ON e.intent_key = h.intent_key"
                f" WHERE h.resource = :resource AND e.intent_key != :key AND e.status IN {_LIVE_SQL}"
                " ORDER BY e.created_at", {"resource": hold.resource, "key": request.intent_key}
            ).fetchall()
            external = request.external_cents.get(hold.resource, 0)
            available = hold.limit_cents - sum(r["held"] for r in rows) - external
            if hold.amount_cents > available:
                return OverBudget(hold.resource, hold.limit_cents, max(available, 0),
                                  [Effect.from_row(r) for r in rows], external)
        return None

    def _check_ceiling(self, conn: _Session, request: Request) -> NeedsApproval | None:
        """The ceiling counts what a task, an item and an order have refunded in total, not one call."""
        if request.ceiling_cents is None or request.approved:
            return None
        task_total = conn.execute(
            "SELECT COALESCE(SUM(amount_cents), 0) AS total FROM effects WHERE task_id = :task AND tool = :tool"
            f" AND intent_key != :key AND status IN {_LIVE_SQL}",
            {"task": request.task_id, "tool": request.tool, "key": request.intent_key}).one()["total"]
        totals = [(f"task:{request.task_id}", task_total)]
        for hold in request.holds:
            held = conn.execute(
                "SELECT COALESCE(SUM(h.amount_cents), 0) AS total FROM holds h JOIN effects e"
                " ON e.intent_key = h.intent_key WHERE h.resource = :resource AND e.intent_key != :key"
                f" AND e.status IN {_LIVE_SQL}",
                {"resource": hold.resource, "key": request.intent_key}).one()["total"]
            totals.append((hold.resource, held + request.external_cents.get(hold.resource, 0)))
        for scope, total in totals:
            if total + request.amount_cents > request.ceiling_cents:
                return NeedsApproval(scope, total + request.amount_cents, request.ceiling_cents)
        return None

    # --- transitions ----------------------------------------------------------------------

    def performed(self, effect: Effect, ref: str, amount: int | None, detail: dict[str, Any]) -> bool:
        """The holder's request succeeded."""
        return self._move(effect, "performed", ref, amount, detail)

    def not_performed(self, effect: Effect, detail: dict[str, Any], ref: str | None = None) -> bool:
        """Nothing happened: the amounts go back to the budgets. `ref`: the provider's record of the request,
        when it holds one that moved nothing (failed)."""
        return self._move(effect, "not_performed", ref, None, detail)

    def unknown(self, effect: Effect, detail: dict[str, Any]) -> bool:
        """Nobody can say now: the amounts stay held until a human decides."""
        return self._move(effect, "unknown", None, None, detail)

    def unseen(self, effect: Effect, detail: dict[str, Any], now: float | None = None) -> bool:
        """Past its horizon, the provider shows nothing of an intent at `intent` or `unknown`: nothing can
        land any more, so it was not performed. Fenced like every write; the amounts go back."""
        now = self._clock() if now is None else now
        with self._db.connect() as conn:
            moved = conn.execute(
                "UPDATE effects SET status = 'not_performed', detail = :detail, lease_until = 0, updated_at = :now"
                " WHERE intent_key = :key AND fence = :fence AND status IN ('intent', 'unknown') AND horizon <= :now",
                {"key": effect.intent_key, "fence": effect.fence, "detail": json.dumps(detail, sort_keys=True),
                 "now": now}).rowcount == 1
            if moved:
                conn.execute("DELETE FROM holds WHERE intent_key = :key", {"key": effect.intent_key})
        return moved

    def leaving(self, effect: Effect, now: float | None = None) -> bool:
        """The holder's request is about to leave for the provider: from here on it may land. Fenced: False
        when the holder lost the intent (it must send nothing)."""
        with self._db.connect() as conn:
            moved = conn.execute(
                "UPDATE effects SET sent_at = :now WHERE intent_key = :key AND fence = :fence AND status = 'intent'",
                {"key": effect.intent_key, "fence": effect.fence,
                 "now": self._clock() if now is None else now}).rowcount == 1
        if not moved:
            log.warning("ledger write refused: attempt lost the intent", extra={
                "intent_key": effect.intent_key, "wanted": "sent", "fence": effect.fence})
        return moved

    def answered(self, effect: Effect, now: float | None = None) -> None:
        """The provider answered the holder's request (with an error: a success settles the row). Fenced: the
        answer is about the holder's own request, the latest to leave."""
        with self._db.connect() as conn:
            conn.execute("UPDATE effects SET answered_at = :now WHERE intent_key = :key AND fence = :fence"
                         " AND sent_at IS NOT NULL", {"key": effect.intent_key, "fence": effect.fence,
                                                      "now": self._clock() if now is None else now})

    def release(self, effect: Effect) -> bool:
        """The holder will not send again: the next attempt need not wait for its lease. The horizon
        stays: the holder's request may still land until then, so nobody may decide the intent not
        performed (nor free its holds) before it (found by devstack/sim)."""
        with self._db.connect() as conn:
            moved = conn.execute(
                "UPDATE effects SET lease_until = 0 WHERE intent_key = :key AND fence = :fence"
                " AND status = 'intent'", {"key": effect.intent_key, "fence": effect.fence}).rowcount == 1
        return moved

    def found(self, key: str, ref: str, amount: int, detail: dict[str, Any]) -> Effect | None:
        """The provider holds the effect: performed, whoever holds the fence. Performed stays final.
        Found on an intent settled not performed, the provider landed a request after the horizon it
        promised (found by devstack/sim's late provider): the row says so (`late_landing`), for people."""
        with self._db.connect() as conn:
            row = conn.execute("SELECT status FROM effects WHERE intent_key = :key" + self._db.lock,
                               {"key": key}).fetchone()
            if row is not None and row["status"] == "not_performed":
                detail = {**detail, "late_landing": True}
                log.error("the provider holds an effect of an intent settled not performed: it landed after its "
                          "settle horizon", extra={"intent_key": key, "provider_ref": ref})
            conn.execute(
                "UPDATE effects SET status = 'performed', provider_ref = :ref, amount_cents = :amount,"
                " detail = :detail, lease_until = 0, updated_at = :now WHERE intent_key = :key"
                " AND status != 'performed'",
                {"key": key, "ref": ref, "amount": amount, "detail": json.dumps(detail, sort_keys=True),
                 "now": self._clock()})
            row = conn.execute("SELECT * FROM effects WHERE intent_key = :key", {"key": key}).fetchone()
        return Effect.from_row(row) if row else None

    def failed(self, key: str, ref: str, detail: dict[str, Any]) -> Effect | None:
        """A provider that honours keys holds the intent's effect as failed or canceled: no money moved, and
        the intent's key only ever answers with that record. Not performed, whoever holds the fence; the
        amounts go back. Performed stays final: a refund that fails after it succeeded is for reconcile and
        people. (At a provider that ignores keys another request of the intent may land: never called.)"""
        with self._db.connect() as conn:
            moved = conn.execute(
                "UPDATE effects SET status = 'not_performed', provider_ref = :ref, detail = :detail,"
                " lease_until = 0, updated_at = :now WHERE intent_key = :key AND status IN ('intent', 'unknown')",
                {"key": key, "ref": ref, "detail": json.dumps(detail, sort_keys=True),
                 "now": self._clock()}).rowcount == 1
            if moved:
                conn.execute("DELETE FROM holds WHERE intent_key = :key", {"key": key})
            row = conn.execute("SELECT * FROM effects WHERE intent_key = :key", {"key": key}).fetchone()
        return Effect.from_row(row) if row else None

    def failed_after(self, ref: str, detail: dict[str, Any], now: float | None = None) -> list[str]:
        """The provider failed an effect the ledger holds as performed (Stripe fails a refund days later when
        the card cannot take it): no money reached anyone, so it holds nothing any more. Not performed; the
        amounts go back (found by review: the item stayed used up, and every later ticket was told it was
        done). Unless a person recorded it while a request of the intent itself may still land: then
        unknown, its amounts held, until the records or a person settle that request. The intents moved."""
        now = self._clock() if now is None else now
        with self._db.connect() as conn:  # a read first: a failed record is listed on every lookup of its order
            if conn.execute("SELECT 1 FROM effects WHERE provider_ref = :ref AND status = 'performed'",
                            {"ref": ref}).fetchone() is None:
                return []
        moved: list[str] = []
        with self._db.connect() as conn:
            rows = [Effect.from_row(r) for r in conn.execute(
                "SELECT * FROM effects WHERE provider_ref = :ref AND status = 'performed'" + self._db.lock,
                {"ref": ref}).fetchall()]
            for row in rows:
                own_may_land = row.detail.get("source") == "human" and row.sent_at is not None \
                    and (row.horizon > now or row.unanswered)
                status = "unknown" if own_may_land else "not_performed"
                conn.execute("UPDATE effects SET status = :status, detail = :detail, updated_at = :now"
                             " WHERE intent_key = :key", {"key": row.intent_key, "status": status, "now": now,
                                                          "detail": json.dumps(detail, sort_keys=True)})
                if status == "not_performed":
                    conn.execute("DELETE FROM holds WHERE intent_key = :key", {"key": row.intent_key})
                moved.append(row.intent_key)
        if moved:
            log.warning("the provider failed an effect recorded performed", extra={"provider_ref": ref,
                                                                                  "intent_keys": moved})
        return moved

    def decided(self, word: HumanWord, expected: tuple[str, ...], as_of: float | None = None) -> Effect:
        """A human's verified word on an intent; only from the `expected` states (performed is final), and
        "not performed" only once no earlier request of the intent can land (its horizon has passed by
        `as_of`, when the provider's records it was checked against were read; found by devstack/sim)."""
        key, status, ref, amount, owner = word.intent_key, word.status, word.ref, word.amount_cents, word.owner
        detail = word.detail
        now = self._clock()
        cutoff = now if as_of is None else as_of
        with self._db.connect() as conn:
            row = conn.execute("SELECT * FROM effects WHERE intent_key = :key" + self._db.lock,
                               {"key": key}).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO effects (intent_key, task_id, tool, arguments, status, owner, attempt, fence,"
                    " provider_ref, amount_cents, detail, created_at, updated_at) VALUES (:key, :task, :tool, :args,"
                    " :status, :owner, 0, 1, :ref, :amount, :detail, :now, :now)",
                    {"key": key, "task": word.task_id, "tool": word.tool,
                     "args": json.dumps(word.arguments, sort_keys=True),
                     "status": status, "owner": owner, "ref": ref, "amount": amount,
                     "detail": json.dumps(detail, sort_keys=True), "now": now})
            elif row["status"] in expected and not (status == "not_performed" and row["horizon"] > min(now, cutoff)):
                # The horizon stays: a request sent before it may still land until then, whatever was decided.
                conn.execute(
                    "UPDATE effects SET status = :status, owner = :owner, fence = fence + 1,"
                    " provider_ref = COALESCE(:ref, provider_ref), amount_cents = COALESCE(:amount, amount_cents),"
                    " detail = :detail, lease_until = 0, updated_at = :now WHERE intent_key = :key",
                    {"key": key, "status": status, "owner": owner, "ref": ref, "amount": amount,
                     "detail": json.dumps(detail, sort_keys=True), "now": now})
                if status == "not_performed":
                    conn.execute("DELETE FROM holds WHERE intent_key = :key", {"key": key})
            row = conn.execute("SELECT * FROM effects WHERE intent_key = :key", {"key": key}).one()
            if status == "performed" and row["status"] == "performed" and row["provider_ref"] == ref \
                    and amount is not None:
                # What a person records holds its item and order as a request of ours would, whatever the
                # provider's record names (a refund made in the dashboard names no item; found by review)
                # and even if the intent's holds went back when it was settled not performed before.
                for resource in word.resources:
                    conn.execute("INSERT INTO holds (intent_key, resource, amount_cents) VALUES (:key, :resource,"
                                 " :amount) ON CONFLICT (intent_key, resource) DO NOTHING",
                                 {"key": key, "resource": resource, "amount": amount})
        return Effect.from_row(row)

    def _move(self, effect: Effect, status: str, ref: str | None, amount: int | None, detail: dict[str, Any]) -> bool:
        with self._db.connect() as conn:
            moved = conn.execute(
                "UPDATE effects SET status = :status, provider_ref = COALESCE(:ref, provider_ref),"
                " amount_cents = COALESCE(:amount, amount_cents), detail = :detail, lease_until = 0,"
                " updated_at = :now WHERE intent_key = :key AND fence = :fence AND status = 'intent'",
                {"status": status, "ref": ref, "amount": amount, "detail": json.dumps(detail, sort_keys=True),
                 "now": self._clock(), "key": effect.intent_key, "fence": effect.fence}).rowcount == 1
            if moved and status == "not_performed":
                conn.execute("DELETE FROM holds WHERE intent_key = :key", {"key": effect.intent_key})
        if not moved:
            current = self.get(effect.intent_key)
            log.warning("ledger write refused: attempt lost the intent", extra={
                "intent_key": effect.intent_key, "wanted": status, "fence": effect.fence,
                "current_status": current.status if current else None,
                "current_fence": current.fence if current else None})
        return moved

    # --- reads ----------------------------------------------------------------------------

    def get(self, key: str) -> Effect | None:
        with self._db.connect() as conn:
            row = conn.execute("SELECT * FROM effects WHERE intent_key = :key", {"key": key}).fetchone()
        return Effect.from_row(row) if row else None

    def by_ref(self, provider_ref: str) -> list[Effect]:
        with self._db.connect() as conn:
            rows = conn.execute("SELECT * FROM effects WHERE provider_ref = :ref", {"ref": provider_ref}).fetchall()
        return [Effect.from_row(r) for r in rows]

    def live_holds(self, keys: list[str]) -> set[tuple[str, str]]:
        """Which of these keys hold an amount against which resource in the ledger: (intent key, resource)
        of every hold whose intent is live (intent, performed or unknown). An intent found performed after
        it was settled not performed (a late landing) is live and holds nothing: its provider record is
        counted by no hold, so the budget must count it from the provider's records."""
        if not keys:
            return set()
        with self._db.connect() as conn:
            rows = conn.execute(
                "SELECT h.intent_key, h.resource FROM holds h JOIN effects e ON e.intent_key = h.intent_key"
                f" WHERE e.status IN {_LIVE_SQL} AND h.intent_key IN ("
                + ", ".join(f":k{i}" for i in range(len(keys))) + ")",
                {f"k{i}": key for i, key in enumerate(keys)}).fetchall()
        return {(r["intent_key"], r["resource"]) for r in rows}

    def keys_of(self, refs: list[str]) -> dict[str, str]:
        """The intent each of these provider references is recorded for (a person may record one that names
        no intent key, such as a refund made in the dashboard)."""
        if not refs:
            return {}
        with self._db.connect() as conn:
            rows = conn.execute(
                "SELECT intent_key, provider_ref FROM effects WHERE provider_ref IN ("
                + ", ".join(f":r{i}" for i in range(len(refs))) + ")",
                {f"r{i}": ref for i, ref in enumerate(refs)}).fetchall()
        return {r["provider_ref"]: r["intent_key"] for r in rows}

    def all(self) -> list[Effect]:
        with self._db.connect() as conn:
            rows = conn.execute("SELECT * FROM effects ORDER BY created_at").fetchall()
        return [Effect.from_row(r) for r in rows]


@dataclass(frozen=True)
class SentEffect(Intent):
    """A message's intent as the ledger keeps it once the outbox holds the message."""

    recipient: str


def record_sent(conn: _Session, sent: SentEffect, now: float) -> None:
    """The message's intent, performed, in the transaction that put the message in the outbox
    (activities/records.py `send_once`): the ledger stays the one writer of `effects`."""
    conn.execute(
        "INSERT INTO effects (intent_key, task_id, tool, arguments, status, owner, provider_ref, detail,"
        " created_at, updated_at) VALUES (:key, :task, :tool, :args, 'performed', :owner, :ref, :detail, :now,"
        " :now) ON CONFLICT (intent_key) DO UPDATE SET status = 'performed', owner = excluded.owner,"
        " provider_ref = excluded.provider_ref, updated_at = excluded.updated_at",
        {"key": sent.intent_key, "task": sent.task_id, "tool": sent.tool,
         "args": json.dumps(sent.arguments, sort_keys=True), "owner": sent.owner,
         "ref": f"outbox:{sent.intent_key}", "detail": json.dumps({"recipient": sent.recipient}), "now": now})


def owner_of(conn: _Session, intent_key: str) -> str | None:
    """Which attempt holds (or held) the intent, if the ledger knows it."""
    row = conn.execute("SELECT owner FROM effects WHERE intent_key = :key", {"key": intent_key}).fetchone()
    return None if row is None else str(row["owner"])
