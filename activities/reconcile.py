"""Compare the effect ledger with the provider, matching by the intent key in metadata."""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from typing import Any

from temporalio import activity

from activities.db import Database
from activities.effects import NOTHING_MOVED
from activities.ledger import EffectLedger
from activities.payments import StripeGateway, intent_key_of
from core.models import Finding, ReconcileInput, ReconcileReport

MONEY_TOOLS = ("issue_refund", "send_payment")


class ReconcileActivities:
    def __init__(self, db: Database, gateway: StripeGateway) -> None:
        self._db = db
        self._gateway = gateway

    @activity.defn(name="reconcile_ledger")
    async def reconcile_ledger(self, request: ReconcileInput) -> ReconcileReport:
        report = await asyncio.to_thread(self._reconcile, request)
        await asyncio.to_thread(self._store, report)
        return report

    def _provider_effects(self) -> list[Any]:
        """Every refund of our orders' payments, and every payment to our payees."""
        with self._db.connect() as conn:
            intents = [r["payment_intent_id"] for r in conn.execute(
                "SELECT payment_intent_id FROM orders WHERE payment_intent_id IS NOT NULL").fetchall()]
            payees = {r["customer_ref"] for r in conn.execute("SELECT customer_ref FROM invoices").fetchall()}
        effects = [r for pi in intents for r in self._gateway.refunds(pi)]
        for payee in payees:
            effects += [p for p in self._gateway.payments_to(payee) if intent_key_of(p) is not None]
        return effects

    def _reconcile(self, request: ReconcileInput) -> ReconcileReport:
        effects = self._provider_effects()
        rows = [e for e in EffectLedger(self._db).all() if e.tool in MONEY_TOOLS]
        by_key: dict[str | None, list[Any]] = defaultdict(list)
        for effect in effects:
            by_key[intent_key_of(effect)].append(effect)
        ledger = {row.intent_key: row for row in rows}
        provider_ids = {e.id for e in effects}
        failed = {e.id: e.status for e in effects if e.status in NOTHING_MOVED}
        findings: list[Finding] = []
        for key, found in by_key.items():
            if key is not None and len(found) > 1:
                findings.append(Finding(kind="duplicate", intent_key=key, provider_refs=[e.id for e in found],
                                        detail=f"{len(found)} provider effects for one intent"))
            if key is None or key not in ledger:
                findings += [Finding(kind="orphan_provider_effect", intent_key=key, provider_refs=[e.id],
                                     detail=f"{e.object} of {e.amount} cents with no ledger row") for e in found]
        now = time.time()
        for row in rows:
            if row.status == "performed" and row.provider_ref not in provider_ids:
                findings.append(Finding(kind="performed_unknown_to_provider", intent_key=row.intent_key,
                                        provider_refs=[row.provider_ref or ""],
                                        detail=f"ledger says performed as {row.provider_ref}; the provider has no such"
                                               " effect"))
            if row.status == "performed" and row.provider_ref in failed:
                findings.append(Finding(kind="failed_at_provider", intent_key=row.intent_key,
                                        provider_refs=[row.provider_ref or ""],
                                        detail=f"ledger says performed as {row.provider_ref}; the provider holds it "
                                               f"as {failed[row.provider_ref or '']}: no money moved"))
            if row.status in ("intent", "unknown") and now - row.updated_at > request.stale_after_seconds:
                findings.append(Finding(kind="stale_intent", intent_key=row.intent_key,
                                        detail=f"left at {row.status} for over {request.stale_after_seconds} s"))
        return ReconcileReport(checked_ledger_rows=len(rows), checked_provider_effects=len(effects),
                               findings=findings)

    def _store(self, report: ReconcileReport) -> None:
        with self._db.connect() as conn:
            conn.execute("INSERT INTO reconciliations (created_at, findings, report) VALUES (:now, :n, :report)",
                         {"now": time.time(), "n": len(report.findings), "report": report.model_dump_json()})


def latest_report(db: Database) -> ReconcileReport | None:
    with db.connect() as conn:
        row = conn.execute("SELECT report FROM reconciliations ORDER BY id DESC LIMIT 1").fetchone()
    return ReconcileReport.model_validate(json.loads(row["report"])) if row else None
