"""The money boundary: one refund per item and one payment per invoice, whatever the provider, the
customer or the clock does. Judged on the provider's own records, grouped by order and item, and on
the ledger's rows."""

from __future__ import annotations

import asyncio
import itertools
import json
import multiprocessing
import os
import signal
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from temporalio.client import Client

from activities.db import Database
from activities.ledger import Claimed, EffectLedger, Hold, Request, Settled
from activities.payments import StripeGateway
from activities.records import Records
from activities.world import World
from core.domain import Item, Order
from core.models import Outcome, TaskInput
from devstack.edge_control import EdgeControl
from devstack.polling import poll_until
from devstack.scenarios import refund_8841
from devstack.seed import seed_order
from devstack.stack import STRIPE_API_KEY, Stack
from infra.settings import Settings
from tests.helpers import finished, run, running_worker, start, unique, waiting

MODES = ["dedupe", "passthrough"]
_orders = itertools.count(int(time.time() * 1000) % 10**9 * 100)


def refund_task(order_id: str, item_id: str, name: str = "refund", **options) -> TaskInput:
    """A refund request for one item of an order, played by the scripted model."""
    task = refund_8841(order_id=order_id, item_id=item_id, **options)
    return task.model_copy(update={"task_id": unique(f"{name}-{order_id}"),
                                   "facts": {"order_id": order_id, "item_id": item_id}})


def scripted(order_id: str, item_id: str, calls: list[dict], name: str = "script") -> TaskInput:
    """Exactly these tool calls, one per turn, whatever they answer."""
    task = refund_task(order_id, item_id, name)
    script = [{"name": c.pop("tool"), "arguments": json.dumps(c)} for c in calls]
    return task.model_copy(update={"model_options": {"script_calls": script}})


def refund_call(order_id: str, item_id: str, cents: int) -> dict:
    return {"tool": "issue_refund", "order_id": order_id, "item_id": item_id, "amount_cents": cents,
            "currency": "usd", "reason": "arrived damaged"}


def by_item(world: World, order_id: str) -> Counter:
    refunded: Counter = Counter()
    for refund in world.refunds(order_id):
        refunded[refund["item_id"]] += refund["amount_cents"]
    return refunded


def assert_ledger_equals_provider(world: World, order_id: str) -> None:
    """Every provider refund has a performed row under its key, and every performed row its refund."""
    refunds = world.refunds(order_id)
    rows = {e["intent_key"]: e for e in world.effects() if e["tool"] == "issue_refund"}
    for refund in refunds:
        row = rows.get(refund["intent_key"])
        assert row is not None and row["status"] == "performed" and row["provider_ref"] == refund["id"], refund
    provider_ids = {r["id"] for r in refunds}
    for row in rows.values():
        if row["status"] == "performed" and row["provider_ref"] in provider_ids | {None}:
            assert [r["id"] for r in refunds if r["intent_key"] == row["intent_key"]] == [row["provider_ref"]]


def fresh_order(world: World, items: list[tuple[str, int]]) -> Order:
    """A new paid order, its id in the shape tickets use (ORD-<digits>)."""
    order = Order(order_id=f"ORD-{next(_orders)}", customer_name="Ada Byrne", customer_email="ada.byrne@example.com",
                  seller="Oakline", seller_email="orders@oakline.example",
                  items=[Item(item_id=i, description=i, amount_cents=c) for i, c in items])
    seed_order(world.records, world.gateway, order)
    return order


# --- a slow provider, a paused worker, a paused attempt ----------------------------------------


@pytest.fixture
def slow(settings: Settings) -> Settings:
    """The provider holds a refund 8 s before it executes; the client gives up after 5 s. The
    processing window (how late a request may still land) is configured to cover that."""
    return settings.model_copy(update={"stripe_timeout_seconds": 5.0, "stripe_processing_window_seconds": 6.0})


SLOW_REFUND = {"method": "POST", "path": "/v1/refunds", "fault": "slow", "delay_seconds": 8.0, "nth": [1]}


@pytest.mark.parametrize("mode", MODES)
async def test_a_provider_slower_than_the_client_pays_once(mode, client: Client, slow: Settings, world: World,
                                                           edge: EdgeControl):
    edge.configure(mode, [SLOW_REFUND])
    async with running_worker(client, slow):
        result = await run(client, slow, refund_task("ORD-8841", "kettle-01", repeat_effects=2))
    assert by_item(world, "ORD-8841") == {"kettle-01": 4500}
    step = result.checkpoint.steps["issue_refund"]
    assert step.trail[0].startswith("ask 1: performed") and step.attempts >= 2, step.trail
    assert step.trail[1:] == ["ask 2: already_performed, from the task journal",
                              "ask 3: already_performed, from the task journal"]
    assert edge.stats()["POST /v1/refunds"] == 1, "nothing was resent while the first request could still land"
    assert_ledger_equals_provider(world, "ORD-8841")


def _stopped(pid: int) -> bool:
    return psutil.Process(pid).status() == psutil.STATUS_STOPPED


async def until(check, what: str, timeout: float = 60.0):
    """Poll a blocking check (a file, a process, the edge's counters) with a deadline."""
    async def once():
        return await asyncio.to_thread(check)
    return await poll_until(once, what, timeout)


def fenced(log: Path) -> bool:
    """The woken worker tried to write the ledger and was refused (its log is JSON lines)."""
    return "ledger write refused" in log.read_text()


async def test_a_worker_paused_while_its_refund_is_held_does_not_pay_twice(
    stack: Stack, client: Client, slow: Settings, world: World, edge: EdgeControl, worker_env: dict[str, str],
    tmp_path: Path,
):
    """Worker A's POST is held at the provider; A is paused (SIGSTOP), its activity times out, worker
    B takes the call over, waits out A's settle horizon, finds A's refund and sends nothing."""
    edge.configure("passthrough", [SLOW_REFUND])
    env = {**worker_env, "STRIPE_TIMEOUT_SECONDS": "5", "STRIPE_PROCESSING_WINDOW_SECONDS": "6"}
    paused = stack.start_worker(tmp_path / "paused.log", env)
    handle = await start(client, slow, refund_task("ORD-8841", "kettle-01"))
    await until(lambda: edge.stats().get("POST /v1/refunds") == 1, "the refund to reach the provider")
    os.kill(paused.process.pid, signal.SIGSTOP)
    other = stack.start_worker(tmp_path / "other.log", env)
    try:
        result = await asyncio.wait_for(handle.result(), 180)
        os.kill(paused.process.pid, signal.SIGCONT)
        await until(lambda: fenced(tmp_path / "paused.log"), "the paused worker to wake up and be fenced")
    finally:
        os.kill(paused.process.pid, signal.SIGCONT)
        paused.stop()
        other.stop()
    assert by_item(world, "ORD-8841") == {"kettle-01": 4500}
    assert edge.stats()["POST /v1/refunds"] == 1
    assert result.checkpoint.steps["issue_refund"].outcome is Outcome.PERFORMED
    assert_ledger_equals_provider(world, "ORD-8841")


@pytest.mark.parametrize("mode", MODES)
async def test_an_attempt_paused_before_its_request_sends_nothing_when_it_wakes(
    mode, stack: Stack, client: Client, settings: Settings, world: World, edge: EdgeControl,
    worker_env: dict[str, str], tmp_path: Path,
):
    """Worker A claims the intent and pauses just before its POST; B takes over after A's horizon and
    refunds; A, woken, finds its send-by time gone and sends nothing; its ledger write is refused."""
    edge.configure(mode)
    paused = stack.start_worker(tmp_path / "paused.log", {
        **worker_env, "CRASH_AT": "issue_refund:before_provider", "CRASH_SIGNAL": "SIGSTOP",
        "CRASH_MARKER": str(tmp_path / "paused")})
    handle = await start(client, settings, refund_task("ORD-8841", "kettle-01"))
    await until(lambda: (tmp_path / "paused").exists() and _stopped(paused.process.pid),
                "worker A to pause before its request")
    other = stack.start_worker(tmp_path / "other.log", worker_env)
    try:
        result = await asyncio.wait_for(handle.result(), 180)
        assert edge.stats()["POST /v1/refunds"] == 1
        os.kill(paused.process.pid, signal.SIGCONT)
        await until(lambda: fenced(tmp_path / "paused.log"), "the paused worker to wake up and be fenced")
    finally:
        os.kill(paused.process.pid, signal.SIGCONT)
        paused.stop()
        other.stop()
    assert edge.stats()["POST /v1/refunds"] == 1, "the woken worker sent nothing"
    assert by_item(world, "ORD-8841") == {"kettle-01": 4500}
    effect = next(e for e in world.effects() if e["tool"] == "issue_refund")
    assert effect["status"] == "performed" and effect["fence"] == 2
    assert result.checkpoint.steps["issue_refund"].outcome is Outcome.PERFORMED


def test_a_write_from_an_attempt_that_lost_the_intent_changes_nothing(settings: Settings):
    """Fencing in the ledger itself: performed is final, and a stale fence writes nothing."""
    db = Database(settings.database)
    db.create()
    ledger = EffectLedger(db)
    holds = (Hold("item:O-1/a", 1000, 1000),)
    ask = dict(intent_key="k1", task_id="t", tool="issue_refund", arguments={}, amount_cents=1000, holds=holds,
               lease_until=0.0, horizon=0.0)
    first = ledger.claim(Request(owner="call", attempt=1, **ask))
    second = ledger.claim(Request(owner="call", attempt=2, **ask))  # the first one's horizon has passed
    assert isinstance(first, Claimed) and isinstance(second, Claimed)
    assert (first.effect.fence, second.effect.fence) == (1, 2)
    assert ledger.performed(second.effect, "re_1", 1000, {})
    assert not ledger.not_performed(first.effect, {"reason": "woke up late"})
    assert not ledger.performed(first.effect, "re_2", 1000, {})
    assert not ledger.unknown(first.effect, {})
    row = ledger.get("k1")
    assert (row.status, row.provider_ref, row.fence) == ("performed", "re_1", 2)
    assert isinstance(ledger.claim(Request(owner="other", attempt=1, **ask)), Settled)


# --- budgets across tickets ----------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("at_once", [False, True], ids=["one-after-the-other", "at-once"])
async def test_two_tickets_for_one_item_refund_it_once(mode, at_once, client: Client, settings: Settings,
                                                       world: World, edge: EdgeControl):
    edge.configure(mode)
    tasks = [refund_task("ORD-8841", "mugs-02", name=f"ticket{n}") for n in (1, 2)]
    async with running_worker(client, settings):
        if at_once:
            results = await asyncio.gather(*(run(client, settings, t) for t in tasks))
        else:
            results = [await run(client, settings, t) for t in tasks]
    assert by_item(world, "ORD-8841") == {"mugs-02": 2400}
    refund = world.refunds("ORD-8841")[0]
    outcomes = sorted(r.checkpoint.steps["issue_refund"].outcome for r in results)
    assert outcomes == [Outcome.ALREADY_PERFORMED, Outcome.PERFORMED]
    told = next(r for r in results if r.checkpoint.steps["issue_refund"].outcome is Outcome.ALREADY_PERFORMED)
    earlier = told.checkpoint.steps["issue_refund"].result
    assert earlier["provider_ref"] == refund["id"] and earlier["amount_cents"] == 2400, earlier
    second = [m for m in world.messages(told.task_id) if m["kind"] == "email"]
    assert len(second) == 1 and "24.00" in second[0]["body"], "the customer is told of the one refund there is"
    assert_ledger_equals_provider(world, "ORD-8841")


@pytest.mark.parametrize("mode", MODES)
async def test_one_ticket_asking_a_slightly_smaller_amount_again_pays_nothing_more(
    mode, client: Client, settings: Settings, world: World, edge: EdgeControl,
):
    edge.configure(mode)
    task = scripted("ORD-8841", "mugs-02", [refund_call("ORD-8841", "mugs-02", 2400),
                                            refund_call("ORD-8841", "mugs-02", 2399)])
    async with running_worker(client, settings):
        result = await run(client, settings, task)
    assert by_item(world, "ORD-8841") == {"mugs-02": 2400}
    second = result.checkpoint.steps["issue_refund#2"]
    assert second.outcome is Outcome.ALREADY_PERFORMED and second.reason == "done_earlier"


@pytest.mark.parametrize("mode", MODES)
async def test_five_tickets_at_once_never_refund_an_order_beyond_what_was_paid(
    mode, client: Client, settings: Settings, world: World, edge: EdgeControl,
):
    """An earlier refund of the kettle, then five tickets at once for the kettle and the mugs."""
    edge.configure(mode)
    async with running_worker(client, settings):
        await run(client, settings, refund_task("ORD-8841", "kettle-01", name="earlier"))
        tickets = [refund_task("ORD-8841", item, name=f"at-once{n}")
                   for n, item in enumerate(["kettle-01", "mugs-02", "mugs-02", "kettle-01", "mugs-02"])]
        results = await asyncio.gather(*(run(client, settings, t) for t in tickets))
    assert by_item(world, "ORD-8841") == {"kettle-01": 4500, "mugs-02": 2400}
    assert sum(r["amount_cents"] for r in world.refunds("ORD-8841")) <= 6900
    assert {r.state for r in results} == {"completed"}
    assert_ledger_equals_provider(world, "ORD-8841")


async def test_refunds_made_outside_the_ledger_use_up_the_order(client: Client, settings: Settings, world: World,
                                                               edge: EdgeControl):
    """A refund someone made by hand (no intent key, no item) still counts against the order."""
    record = world.records.order("ORD-8841")
    world.gateway.refund(record.payment_intent_id, 4500, "by-hand-1", {"order_id": "ORD-8841"})
    async with running_worker(client, settings):
        mugs = await run(client, settings, refund_task("ORD-8841", "mugs-02", name="mugs"))
        kettle = await start(client, settings, refund_task("ORD-8841", "kettle-01", name="kettle"))
        cp = await waiting(kettle)  # the model, told no, hands the ticket to a human
        await kettle.cancel()
        await finished(kettle)
    assert sum(r["amount_cents"] for r in world.refunds("ORD-8841")) == 6900
    assert mugs.checkpoint.steps["issue_refund"].outcome is Outcome.PERFORMED
    refused = cp.steps["issue_refund"]
    assert refused.outcome is Outcome.NOT_PERFORMED and refused.reason == "exceeds_budget", refused


async def test_partial_refunds_that_fit_the_budget_still_work(client: Client, settings: Settings, world: World):
    """A second damaged item a week later, and a goodwill credit on an item already partly refunded."""
    order = fresh_order(world, [("lamp", 6000), ("vase", 3000)])
    async with running_worker(client, settings):
        await run(client, settings, refund_task(order.order_id, "lamp", amount_cents=2000, name="goodwill"))
        await run(client, settings, refund_task(order.order_id, "vase", name="week-later"))
        await run(client, settings, refund_task(order.order_id, "lamp", amount_cents=4000, name="rest"))
        over = await run(client, settings, refund_task(order.order_id, "lamp", amount_cents=1, name="over"))
    assert by_item(world, order.order_id) == {"lamp": 6000, "vase": 3000}
    assert over.checkpoint.steps["issue_refund"].outcome is Outcome.ALREADY_PERFORMED


# --- the approval ceiling counts totals --------------------------------------------------------


async def test_splitting_a_refund_never_avoids_a_human(client: Client, settings: Settings, world: World):
    """9,000 + 9,001 + 9,002 cents on one $300 item: the second call already waits for a human, and
    so does another ticket's 9,000 on the same item."""
    order = fresh_order(world, [("chair", 30000)])
    split = scripted(order.order_id, "chair", [refund_call(order.order_id, "chair", c) for c in (9000, 9001, 9002)])
    other = refund_task(order.order_id, "chair", amount_cents=9000, name="other")
    async with running_worker(client, settings):
        handle = await start(client, settings, split)
        cp = await waiting(handle)
        assert cp.waiting_for.reason == "approval_required"
        assert cp.waiting_for.arguments["amount_cents"] == 9001
        other_handle = await start(client, settings, other)
        other_cp = await waiting(other_handle)
        assert other_cp.waiting_for.reason == "approval_required"
        assert [r["amount_cents"] for r in world.refunds(order.order_id)] == [9000]
        for h in (handle, other_handle):
            await h.cancel()
        results = [await finished(h) for h in (handle, other_handle)]
    assert {r.state for r in results} == {"cancelled"}
    assert [r["amount_cents"] for r in world.refunds(order.order_id)] == [9000]


# --- the demo world is seeded once ----------------------------------------------------------------


def _seed(db_path: str, stripe_url: str, orders: list[Order], go) -> None:
    go.wait(30)
    records = Records(Database(db_path))
    for order in orders:
        seed_order(records, StripeGateway(STRIPE_API_KEY, stripe_url, 10.0), order)


def test_twenty_seeders_at_once_charge_each_order_once(settings: Settings, edge: EdgeControl, tmp_path: Path):
    edge.configure("passthrough")
    db_path = str(tmp_path / "seeded.db")
    Database(db_path).create()
    orders = [Order(order_id=unique(f"SEED-{n}"), customer_name="Ada", customer_email="ada@example.com",
                    seller="Oakline", seller_email="orders@oakline.example",
                    items=[Item(item_id="lamp", description="lamp", amount_cents=1000 * n)]) for n in (1, 2, 3)]
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    seeders = [ctx.Process(target=_seed, args=(db_path, settings.stripe_api_base, orders, go)) for _ in range(20)]
    for p in seeders:
        p.start()
    go.set()
    for p in seeders:
        p.join(120)
    assert [p.exitcode for p in seeders] == [0] * 20
    records = Records(Database(db_path))
    charges = Counter(p.metadata.to_dict().get("order_id") for p in
                      StripeGateway(STRIPE_API_KEY, settings.stripe_api_base, 10.0).payments())
    for order in orders:
        assert charges[order.order_id] == 1, order.order_id
        assert records.order(order.order_id).payment_intent_id is not None
