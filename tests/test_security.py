"""Secrets never enter workflow inputs, activity inputs or histories; alerts reach the webhook
with its token, which stays in the worker."""

from __future__ import annotations

import base64
import json
import logging
import re
from pathlib import Path

import pytest
from aiohttp import web
from pydantic import SecretStr
from temporalio.client import Client

from activities.world import World
from devstack.polling import poll_until
from devstack.processes import free_port
from infra.settings import Settings
from tests.approvers import signed
from tests.helpers import checkpoint, finished, running_worker, scenario_task, start, waiting

HISTORIES = Path(__file__).parent / "histories"
STRIPE_KEY = "sk_test_ScanMe7f3a9c41d2"
WEBHOOK_TOKEN = "whtok-ScanMe-91b2c7"
SECRET_SHAPES = re.compile(r"(sk|rk)_(live|test)_[A-Za-z0-9]+|whtok-[A-Za-z0-9-]+")


def readable(history_json: str) -> str:
    """The history's text with every payload's base64 data decoded next to it."""
    decoded = []
    for blob in re.findall(r'"data":\s*"([A-Za-z0-9+/=]+)"', history_json):
        try:
            decoded.append(base64.b64decode(blob).decode("utf-8", errors="replace"))
        except ValueError:
            pass
    return history_json + "\n".join(decoded)


@pytest.mark.parametrize("path", sorted(HISTORIES.rglob("*.json")), ids=lambda p: p.stem)
def test_recorded_histories_hold_no_secret(path: Path):
    text = readable(path.read_text())
    assert "sk_test_local" not in text
    assert not SECRET_SHAPES.search(text), SECRET_SHAPES.search(text).group(0)


@pytest.fixture
async def webhook():
    received: list[tuple[str, dict]] = []

    async def alert(request: web.Request) -> web.Response:
        received.append((request.headers.get("Authorization", ""), await request.json()))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/alerts", alert)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}/alerts", received
    await runner.cleanup()


async def test_a_live_task_keeps_its_secrets_out_of_history_and_alerts_the_webhook(
    client: Client, settings: Settings, world: World, webhook,
):
    url, received = webhook
    secret = settings.model_copy(update={"stripe_api_key": SecretStr(STRIPE_KEY), "alert_webhook_url": url,
                                         "alert_webhook_token": SecretStr(WEBHOOK_TOKEN),
                                         "approval_ceiling_cents": 10000})
    task = scenario_task("SU-88421")
    async with running_worker(client, secret):
        handle = await start(client, secret, task)
        cp = await waiting(handle)
        await handle.signal("resolve", signed(handle.id, cp.waiting_for.intent_key, "approve"))
        result = await finished(handle)
    assert result.state == "completed" and len(world.refunds("SU-88421")) == 1
    [(auth, body)] = received
    assert auth == f"Bearer {WEBHOOK_TOKEN}"
    assert (body["kind"], body["reason"], body["intent_key"]) == ("escalation", "approval_required",
                                                                  cp.waiting_for.intent_key)
    assert " | read " in body["summary"] and "not_performed" in body["summary"], "the alert says what was read"
    history = await handle.fetch_history()
    text = readable(history.to_json())
    assert STRIPE_KEY not in text and WEBHOOK_TOKEN not in text
    assert json.loads(history.to_json())["events"], "the scan looked at a real history"


async def test_an_unreachable_alert_webhook_does_not_end_the_task(client: Client, settings: Settings, world: World):
    """The webhook refuses every alert: the task still waits, is resolved, and records the failure."""
    down = settings.model_copy(update={"alert_webhook_url": "http://127.0.0.1:9/alerts",
                                       "approval_ceiling_cents": 10000})
    task = scenario_task("SU-88421")
    async with running_worker(client, down):
        handle = await start(client, down, task)
        cp = await waiting(handle, timeout=120)
        await handle.signal("resolve", signed(handle.id, cp.waiting_for.intent_key, "approve"))
        result = await finished(handle)
    assert result.state == "completed" and len(world.refunds("SU-88421")) == 1
    assert result.checkpoint.alert_failures and "escalation approval_required" in result.checkpoint.alert_failures[0]
    # The escalation did not wait for the webhook: the approved refund ran while the alert was still retried.
    events = (await handle.fetch_history()).events
    names = {e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name for e in events
             if e.HasField("activity_task_scheduled_event_attributes")}
    alert_failed = next(e.event_id for e in events if e.HasField("activity_task_failed_event_attributes")
                        and names[e.activity_task_failed_event_attributes.scheduled_event_id] == "raise_alert")
    refund_scheduled = next(i for i, name in names.items() if name == "issue_refund")
    assert refund_scheduled < alert_failed, "the task was decidable before the alert gave up"


WEBHOOK_PATH = "hooks/T0ScanMe/B0ScanMe/ScanMePathSecret"
WEBHOOK_QUERY_TOKEN = "qtok-ScanMe-5e1d"


@pytest.fixture
async def failing_webhook():
    """A webhook that answers 500 at a secret path: its URL is quoted in the client's error (aiohttp
    puts the whole URL in ClientResponseError). The receiver's own access log is off: it is not the worker's."""
    received: list[str] = []

    async def refuse(request: web.Request) -> web.Response:
        received.append(request.path_qs)
        return web.Response(status=500, text="down")

    app = web.Application()
    app.router.add_post(f"/{WEBHOOK_PATH}", refuse)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}/{WEBHOOK_PATH}?token={WEBHOOK_QUERY_TOKEN}", received
    await runner.cleanup()


async def test_a_failing_alert_webhook_leaves_its_url_secrets_nowhere(
    client: Client, settings: Settings, world: World, failing_webhook, caplog,
):
    """Without an encryption key the failures are plain text in the history: the webhook's secret path
    and its `?token=` must not be in them (nor its bearer token), nor in the checkpoint, nor in the worker's log."""
    url, received = failing_webhook
    alerting = settings.model_copy(update={"alert_webhook_url": url, "alert_webhook_token": SecretStr(WEBHOOK_TOKEN),
                                           "approval_ceiling_cents": 10000})
    caplog.set_level(logging.DEBUG)
    task = scenario_task("SU-88421")
    async with running_worker(client, alerting):
        handle = await start(client, alerting, task)
        cp = await poll_until(lambda: _alert_failed(handle), "the escalation's alert to fail", 120)
        await handle.signal("resolve", signed(handle.id, cp.waiting_for.intent_key, "approve"))
        result = await finished(handle)
    assert received and all(WEBHOOK_PATH in r for r in received), "the webhook was reached and answered 500"
    assert "500" in cp.alert_failures[0] and "127.0.0.1" in cp.alert_failures[0]
    history = readable((await handle.fetch_history()).to_json())
    assert "ActivityTaskFailed" in history or "activityTaskFailedEventAttributes" in history
    for where, text in (("history", history), ("checkpoint", cp.model_dump_json()),
                        ("result", result.model_dump_json()), ("worker log", caplog.text)):
        for secret in (WEBHOOK_PATH.split("/")[-1], WEBHOOK_QUERY_TOKEN, WEBHOOK_TOKEN):
            assert secret not in text, f"{secret} in the {where}"
    assert result.state == "completed" and len(world.refunds("SU-88421")) == 1


async def _alert_failed(handle):
    cp = await checkpoint(handle)
    return cp if cp.alert_failures and cp.state == "awaiting_human" else None
