"""Alerts and dead letters: how a task that needs people reaches them (a human's word on an effect is
recorded by the tools, activities/tools.py, which check it against the provider)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from temporalio import activity

from activities.db import Database
from core.failures import AlertNotDelivered
from core.models import AlertInput, DeadLetterInput
from infra.redact import redact

log = logging.getLogger("agent.alerts")


class OperationsActivities:
    """`webhook_url` and `webhook_token` come from the worker's environment, never from history."""

    def __init__(self, db: Database, webhook_url: str | None = None, webhook_token: str | None = None) -> None:
        self._db = db
        self._url = webhook_url
        self._token = webhook_token

    def activities(self) -> list[Callable[..., Any]]:
        return [self.raise_alert, self.store_dead_letter]

    @activity.defn(name="raise_alert")
    async def raise_alert(self, alert: AlertInput) -> str:
        """POST to the webhook when one is configured, else a structured log line; always a row.

        The row is written before the alert leaves, as `sending`, and says how it went after: an
        attempt lost after its POST reached someone (the worker died) still leaves its row, so a
        later attempt that finds the question settled knows whom to tell it is withdrawn
        (activities/asking.py). A row left at `sending` or `failed` means "may have been seen"."""
        await asyncio.to_thread(self._store_alert, alert, "sending")
        try:
            if self._url:
                await self._post(self._url, alert)
                delivered = "webhook"
            else:
                log.warning(json.dumps({"alert": alert.kind, "task_id": alert.task_id, "reason": alert.reason,
                                        "intent_key": alert.intent_key, "summary": alert.summary}))
                delivered = "log"
        except AlertNotDelivered:
            await asyncio.to_thread(self._mark_alert, alert.alert_key, "failed")
            raise
        await asyncio.to_thread(self._mark_alert, alert.alert_key, delivered)
        return delivered

    async def _post(self, url: str, alert: AlertInput) -> None:
        """A failed delivery is raised with its text redacted and without the client's error as its
        cause: the webhook URL's path and `?token=` are secrets (aiohttp quotes the whole URL), and
        Temporal writes the failure with its cause chain into the history, in plain text without
        PAYLOAD_ENCRYPTION_KEY, and the workflow copies it into `checkpoint.alert_failures`."""
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
                async with session.post(url, json=alert.model_dump(mode="json"), headers=headers) as response:
                    response.raise_for_status()
        except Exception as err:  # aiohttp's errors, a timeout, a URL aiohttp refuses (ValueError)
            why = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
            raise AlertNotDelivered(f"alert webhook at {redact(url)}: {redact(why)}") from None

    def _store_alert(self, alert: AlertInput, delivered: str) -> None:
        with self._db.connect() as conn:
            conn.execute(
                "INSERT INTO alerts (alert_key, task_id, kind, reason, intent_key, summary, delivered, created_at)"
                " VALUES (:key, :task, :kind, :reason, :intent, :summary, :delivered, :now)"
                " ON CONFLICT (alert_key) DO NOTHING",
                {"key": alert.alert_key, "task": alert.task_id, "kind": alert.kind, "reason": alert.reason,
                 "intent": alert.intent_key, "summary": alert.summary, "delivered": delivered, "now": time.time()})

    def _mark_alert(self, alert_key: str, delivered: str) -> None:
        with self._db.connect() as conn:
            conn.execute("UPDATE alerts SET delivered = :delivered WHERE alert_key = :key",
                         {"key": alert_key, "delivered": delivered})

    def alert_stored(self, alert_key: str) -> bool:
        with self._db.connect() as conn:
            row = conn.execute("SELECT 1 FROM alerts WHERE alert_key = :key", {"key": alert_key}).fetchone()
        return row is not None

    @activity.defn(name="store_dead_letter")
    async def store_dead_letter(self, letter: DeadLetterInput) -> None:
        await asyncio.to_thread(self._store_dead_letter, letter)

    def _store_dead_letter(self, letter: DeadLetterInput) -> None:
        with self._db.connect() as conn:
            conn.execute(
                "INSERT INTO dead_letters (task_id, run_id, reason, checkpoint, created_at)"
                " VALUES (:task, :run, :reason, :checkpoint, :now) ON CONFLICT (task_id, run_id) DO NOTHING",
                {"task": letter.task_id, "run": letter.run_id, "reason": letter.reason,
                 "checkpoint": json.dumps(letter.checkpoint), "now": time.time()})


def dead_letters(db: Database, task_id: str | None = None) -> list[dict[str, Any]]:
    with db.connect() as conn:
        sql, params = "SELECT * FROM dead_letters", {}
        if task_id:
            sql, params = sql + " WHERE task_id = :task", {"task": task_id}
        rows = conn.execute(sql + " ORDER BY created_at", params).fetchall()
    return [{**dict(r), "checkpoint": json.loads(r["checkpoint"])} for r in rows]


def alerts(db: Database, task_id: str | None = None) -> list[dict[str, Any]]:
    with db.connect() as conn:
        sql, params = "SELECT * FROM alerts", {}
        if task_id:
            sql, params = sql + " WHERE task_id = :task", {"task": task_id}
        return [dict(r) for r in conn.execute(sql + " ORDER BY created_at", params).fetchall()]


def mark_redriven(db: Database, task_id: str) -> None:
    with db.connect() as conn:
        conn.execute("UPDATE dead_letters SET redriven_at = :now WHERE task_id = :task AND redriven_at IS NULL",
                     {"now": time.time(), "task": task_id})
