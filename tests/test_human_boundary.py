"""The human boundary: nobody is asked about what the ledger and the provider already settle, no
answer is kept that they contradict, an answer never lets a second request out while an earlier one
may still land, and a task's own ceiling counts totals. Judged on the provider's refunds and the
ledger's rows, with signed decisions sent to a real server."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from pathlib import Path

import pytest
import urllib3
from aiohttp import web
from temporalio import activity
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from activities import payments
from activities.asking import AskingActivities
from activities.db import Database
from activities.effects import Effects
from activities.ledger import Claimed, EffectLedger, Hold, HumanWord, Request
from activities.operations import OperationsActivities
from activities.payments import NotSent, StripeGateway, send_before
from activities.tools import ToolActivities
from activities.world import World
from core.authority import Ceilings
from core.models import SETTLED, AlertInput, AskAnswer, AskInput, Checkpoint, Outcome, TaskResult, ToolInput, ToolResult
from devstack.edge_control import EdgeControl
from devstack.processes import free_port
from devstack.stack import STRIPE_API_KEY, Stack
from infra.settings import Settings
from tests.approvers import signed
from tests.helpers import alert_kinds, checkpoint, finished, running_worker, scenario_task, start, wait_for, waiting
from tests.test_lease import attempt
from tests.test_money_boundary import assert_ledger_equals_provider, fresh_order, refund_call, scripted, until
from worker import provider_terms

LANDED_UNREADABLE = [  # the refund lands, the client times out, and the refunds cannot be listed
    {"method": "POST", "path": "/v1/refunds", "fault": "timeout_after_accept", "nth": [1], "delay_seconds": 2.0},
    {"method": "GET", "path": "/v1/refunds", "fault": "fail", "after_rule": 0},
]


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return settings.model_copy(update={"stripe_timeout_seconds": 1.0})


def refunds_of(world: World, order_id: str) -> list[int]:
    return [r["amount_cents"] for r in world.refunds(order_id)]


async def decided(handle, status: str, via: str = "signal") -> Checkpoint:
    async def check():
        cp = await checkpoint(handle)
        return cp if any(d.status == status and d.via == via for d in cp.decisions) else None
    return await wait_for(check, f"a decision {status} via {via}", 60)


# --- 1. an answer while a request may still land --------------------------------------------------


async def test_a_person_is_asked_only_after_a_request_in_flight_can_no_longer_land(
    stack: Stack, client: Client, settings: Settings, world: World, edge: EdgeControl, worker_env: dict[str, str],
    tmp_path: Path,
):
    """Key-ignoring provider: the refund POST is held 30 s; its worker is killed; the refunds cannot be
    listed, so the survivor's attempts run out while the POST is still held. The task waits out the
    request's settle horizon before it asks anyone; the person's mark_not_performed then cannot let a
    second refund out, and once the provider can be read the landed refund settles the call."""
    slow = settings.model_copy(update={"stripe_timeout_seconds": 20.0, "stripe_processing_window_seconds": 15.0})
    edge.configure("passthrough", [
        {"method": "POST", "path": "/v1/refunds", "fault": "slow", "delay_seconds": 30.0, "nth": [1]},
        {"method": "GET", "path": "/v1/refunds", "fault": "fail", "after_rule": 0},
    ])
    doomed = stack.start_worker(tmp_path / "doomed.log", {
        **worker_env, "STRIPE_TIMEOUT_SECONDS": "20", "STRIPE_PROCESSING_WINDOW_SECONDS": "15"})
    handle = await start(client, slow, scenario_task("SU-88421"))
    try:
        await until(lambda: edge.stats().get("POST /v1/refunds") == 1, "the refund POST to be held")
        sent_at = time.time()
        os.kill(doomed.process.pid, signal.SIGKILL)
    finally:
        doomed.stop()
    async with running_worker(client, slow):
        cp = await waiting(handle, 180)
        asked_at = time.time()
        assert asked_at >= sent_at + 30, "asked only after the held request (30 s at the provider) landed"
        assert cp.waiting_for.world and "cannot be read" in cp.waiting_for.world, cp.waiting_for
        assert any(line.startswith("world: in flight until") for line in cp.steps["issue_refund"].trail)
        await handle.signal("resolve", signed(handle.id, cp.waiting_for.intent_key, "mark_not_performed",
                                              note="nothing on the dashboard"))
        await decided(handle, "applied")
        edge.configure("passthrough")
        result = await finished(handle)
    assert refunds_of(world, "SU-88421") == [11800], "the person's answer let no second refund out"
    assert result.checkpoint.steps["issue_refund"].outcome in SETTLED
    assert_ledger_equals_provider(world, "SU-88421")


def test_the_ledger_keeps_not_performed_from_a_person_until_the_horizon(settings: Settings):
    """A person's not_performed before the horizon of the intent's last request is not kept, and the
    row keeps its horizon whatever a person decides."""
    ledger = EffectLedger(Database(settings.agent_db_path))
    Database(settings.agent_db_path).create()
    now = time.time()
    claim = ledger.claim(Request(intent_key="k-horizon", task_id="t", tool="issue_refund", arguments={}, owner="a",
                                 attempt=1, amount_cents=100, holds=(Hold("item:O/i", 100, 100),),
                                 lease_until=now + 2, horizon=now + 60), now)
    assert isinstance(claim, Claimed)
    ledger.unknown(claim.effect, {"reason": "unverified"})
    early = ledger.decided(HumanWord("k-horizon", "not_performed", None, None, {}, "t", "issue_refund", {},
                                     "human:alice"), expected=("intent", "unknown", "not_performed"))
    assert early.status == "unknown" and early.horizon == claim.effect.horizon
    assert ledger.claim(Request(intent_key="k-horizon", task_id="t", tool="issue_refund", arguments={}, owner="b",
                                attempt=2, amount_cents=100, holds=(Hold("item:O/i", 100, 100),),
                                lease_until=now + 2, horizon=now + 60), now).__class__.__name__ == "Doubtful"


# --- 2. a settled intent is never put to a person ---------------------------------------------------


def answer_lost(settings: Settings):
    """The real refund tool, whose answers never reach the workflow: every attempt refunds (or finds
    the refund) and then fails, as a live attempt timed out by the server does. Attempts run out."""
    db = Database(settings.agent_db_path)
    tools = ToolActivities(db, StripeGateway(STRIPE_API_KEY, settings.stripe_api_base, settings.stripe_timeout_seconds),
                           Ceilings(settings.approval_ceiling_cents), provider_terms(settings))

    @activity.defn(name="issue_refund")
    async def issue_refund(call: ToolInput) -> ToolResult:
        await tools.issue_refund(call)
        raise ApplicationError("the answer was lost on its way back", non_retryable=True)
    return issue_refund


async def test_attempts_exhausted_after_the_refund_landed_is_settled_without_asking(
    client: Client, settings: Settings, world: World,
):
    async with running_worker(client, settings, replace=[answer_lost(settings)]):
        handle = await start(client, settings, scenario_task("SU-88421"))
        result = await finished(handle)
    assert refunds_of(world, "SU-88421") == [11800]
    step = result.checkpoint.steps["issue_refund"]
    assert step.outcome is Outcome.PERFORMED and result.checkpoint.escalations == 0, step.trail
    assert "read from the ledger and the provider" in step.trail[-1]
    [notice] = [m for m in world.messages(handle.id) if m["kind"] == "email"]
    assert "118.00" in notice["body"], "the customer is told about the refund that happened"


async def test_a_provider_outage_past_six_reads_is_waited_out_not_put_to_a_person(
    client: Client, settings: Settings, world: World, edge: EdgeControl,
):
    """A provider restarting refuses connections for as long as its stop and start take: a chaos run put
    13 tickets in a row to a person when their order could not be read for the 7.75 s six attempts
    spanned. Here the refund list is dropped for seven reads in a row: the task reads again until the
    provider answers, refunds once and asks nobody."""
    edge.configure("dedupe", [{"method": "GET", "path": "/v1/refunds", "fault": "drop_before_commit",
                               "nth": list(range(1, 8))}])
    async with running_worker(client, settings):
        result = await finished(await start(client, settings, scenario_task("SU-88421")))
    assert edge.stats().get("fault:drop_before_commit", 0) == 7
    assert result.state == "completed" and result.checkpoint.escalations == 0, result.checkpoint.steps
    assert refunds_of(world, "SU-88421") == [11800]
    assert_ledger_equals_provider(world, "SU-88421")


@pytest.mark.parametrize("lost, answer", [(True, "approve"), (True, "mark_not_performed"), (False, "approve")])
async def test_an_answer_the_provider_contradicts_is_refused_and_the_refund_stands(
    lost, answer, client: Client, fast: Settings, world: World, edge: EdgeControl,
):
    """The refund landed while the provider could not be read, so the task asked (attempts exhausted,
    or an unknown outcome). By the time the person answers "it was not done" / "try again" (no
    `reject`: the call may have happened), the provider can be read and shows the refund: the answer is refused and recorded, the
    task completes with the refund, the customer is told about it, and the Update's caller learns
    it was refused."""
    edge.configure("passthrough", LANDED_UNREADABLE)
    async with running_worker(client, fast, replace=[answer_lost(fast)] if lost else []):
        handle = await start(client, fast, scenario_task("SU-88421"))
        cp = await waiting(handle)
        assert cp.waiting_for.reason == ("attempts_exhausted" if lost else "unknown_outcome")
        edge.configure("passthrough")
        [refund] = world.refunds("SU-88421")
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update("decide", signed(handle.id, cp.waiting_for.intent_key, answer))
        assert refund["id"] in str(refused.value.cause)
        result = await finished(handle)
    assert refunds_of(world, "SU-88421") == [11800]
    [record] = [d for d in result.checkpoint.decisions if d.via == "world_check"]
    assert record.status == "refused" and refund["id"] in record.why
    step = result.checkpoint.steps["issue_refund"]
    assert step.outcome is Outcome.PERFORMED and step.result["provider_ref"] == refund["id"]
    assert result.state == "completed" and result.checkpoint.escalations == 1
    [notice] = [m for m in world.messages(handle.id) if m["kind"] == "email"]
    assert "118.00" in notice["body"]
    assert_ledger_equals_provider(world, "SU-88421")


async def asked_then_carried_into_a_new_run(
    client: Client, settings: Settings, world: World, edge: EdgeControl, mode: str, faults: list[dict],
) -> tuple[WorkflowHandle, TaskResult, list[dict]]:
    """What the two tests of a question carried into a new run share (they differ in the provider's faults and
    in what they judge): under `faults` SU-88421 is asked a question, the provider is made readable, and before
    the task reads it again a junk signal rolls the wait over into a new run. The handle, the task's result and
    the order's refunds at the provider as the signal was sent."""
    slow_recheck = settings.model_copy(update={"stripe_processing_window_seconds": 20.0})
    edge.configure(mode, faults)
    async with running_worker(client, slow_recheck):
        task = scenario_task("SU-88421").model_copy(update={"max_history_bytes": 200_000})
        handle = await start(client, slow_recheck, task)
        asked = await waiting(handle)
        assert asked.waiting_for.reason == "unknown_outcome" and asked.runs == 1, asked.waiting_for
        edge.configure(mode)
        at_rollover = world.refunds("SU-88421")
        await handle.signal("resolve", "x" * 300_000)
        return handle, await finished(handle), at_rollover


async def test_a_question_carried_into_a_new_run_that_the_world_settles_is_withdrawn(
    client: Client, fast: Settings, world: World, edge: EdgeControl,
):
    """The refund landed and its answer was lost while the refunds could not be listed: a person is asked.
    The provider becomes readable and, before the task reads it again (a processing window later), a
    junk signal rolls the wait over into a new run, which reads the world first and finds the refund.
    Nobody is needed any more: the question is withdrawn (the person is told, nothing waits), not left
    standing for a decision that would apply to the task's next question."""
    handle, result, _ = await asked_then_carried_into_a_new_run(client, fast, world, edge, "passthrough",
                                                                LANDED_UNREADABLE)
    cp = result.checkpoint
    assert cp.runs == 2, "the question was taken up by a new run"
    assert result.state == "completed" and cp.waiting_for is None and cp.escalations == 1, cp.waiting_for
    [refund] = world.refunds("SU-88421")
    step = cp.steps["issue_refund"]
    assert step.outcome is Outcome.PERFORMED and step.result["provider_ref"] == refund["id"], step.trail
    kinds = alert_kinds(fast, handle.id)
    assert kinds == ["escalation", "escalation_withdrawn"], kinds
    assert_ledger_equals_provider(world, "SU-88421")


async def test_a_decision_on_a_carried_question_that_the_world_then_settles_is_not_kept(
    client: Client, fast: Settings, world: World, edge: EdgeControl,
):
    """The refund landed and its answer was lost: a person is asked (question 1). A junk signal rolls the wait
    into a new run, which reads the world first, slowly; meanwhile a person approves question 1 (send it
    again), and then the world shows the refund. The approval is answered as not acted on, with why: it is
    neither reported applied nor kept for whatever the task asks next, and nothing is sent again."""
    edge.configure("passthrough", LANDED_UNREADABLE)
    task = scenario_task("SU-88421").model_copy(update={"max_history_bytes": 200_000})
    async with running_worker(client, fast):
        handle = await start(client, fast, task)
        asked = (await waiting(handle)).waiting_for
        assert (asked.reason, asked.question) == ("unknown_outcome", 1), asked
    patient = fast.model_copy(update={"stripe_timeout_seconds": 10.0})  # a slow read, not a failed one
    edge.configure("passthrough", [{"method": "GET", "path": "/v1/refunds", "fault": "slow", "delay_seconds": 4.0}])
    posts = edge.stats().get("POST /v1/refunds", 0)
    async with running_worker(client, patient):
        await handle.signal("resolve", "x" * 300_000)

        async def rolled():
            cp = await checkpoint(handle)
            return cp if cp.runs == 2 else None
        await wait_for(rolled, "the wait rolled into a new run", 60)
        with pytest.raises(WorkflowUpdateFailedError) as answer:
            await handle.execute_update("decide", signed(handle.id, asked, "approve"))
        assert "decision ignored: the records settled the question first" in str(answer.value.cause), answer.value
        result = await finished(handle)
    edge.configure("passthrough")
    [refund] = world.refunds("SU-88421")
    assert edge.stats().get("POST /v1/refunds", 0) == posts, "nothing was sent again"
    cp = result.checkpoint
    assert result.state == "completed" and cp.runs == 2 and cp.escalations == 1, cp.waiting_for
    assert cp.steps["issue_refund"].result["provider_ref"] == refund["id"]
    assert [(d.via, d.status) for d in cp.decisions][-2:] == [("update", "applied"), ("world_check", "ignored")]
    assert alert_kinds(fast, handle.id) == ["escalation", "escalation_withdrawn"]
    assert_ledger_equals_provider(world, "SU-88421")


NEVER_LANDED_UNREADABLE = [  # no refund request reaches the provider, each is dropped, and refunds cannot be listed
    {"method": "POST", "path": "/v1/refunds", "fault": "drop_before_commit", "from_nth": 1},
    {"method": "GET", "path": "/v1/refunds", "fault": "fail", "after_rule": 0},
]


async def test_a_carried_question_about_a_refund_that_never_landed_is_settled_by_the_records(
    client: Client, fast: Settings, world: World, edge: EdgeControl,
):
    """A provider that honours keys drops every refund request before it commits, and refunds cannot be
    listed: the outcome is unknown and a person is asked. The provider becomes readable, and before the
    task reads it again a junk signal rolls the wait over into a new run. Past the request's horizon the
    provider holds nothing of it: not performed, as the run that asked would have found. Nobody is needed
    (the question is withdrawn, the person told) and the refund is made, once."""
    honours_keys = fast.model_copy(update={"stripe_honours_keys": True})
    handle, result, at_rollover = await asked_then_carried_into_a_new_run(client, honours_keys, world, edge, "dedupe",
                                                                          NEVER_LANDED_UNREADABLE)
    assert at_rollover == [], "no refund had landed when the wait rolled over"
    cp = result.checkpoint
    assert cp.runs == 2, "the question was taken up by a new run"
    assert result.state == "completed" and cp.waiting_for is None and cp.escalations == 1, cp.waiting_for
    assert refunds_of(world, "SU-88421") == [11800]
    assert cp.steps["issue_refund"].outcome is Outcome.PERFORMED, cp.steps["issue_refund"].trail
    kinds = alert_kinds(fast, handle.id)
    assert kinds == ["escalation", "escalation_withdrawn"], kinds
    assert_ledger_equals_provider(world, "SU-88421")


class _LedgerLostAfterSending(EffectLedger):
    """The worker loses its ledger (a crash, the database gone) between the provider's answer and its write."""

    def performed(self, effect, ref, amount, detail) -> bool:
        raise RuntimeError("the ledger could not be written after the provider's answer")


def refunds_then_fails(settings: Settings) -> list:
    """An issue_refund whose first attempt makes the refund and loses the ledger before it writes the answer;
    every later attempt finds the ledger still gone: the call runs out of attempts though its refund landed."""
    tools = ToolActivities(Database(settings.agent_db_path),
                           StripeGateway(STRIPE_API_KEY, settings.stripe_api_base, settings.stripe_timeout_seconds),
                           Ceilings(settings.approval_ceiling_cents), provider_terms(settings))
    tools._effects = Effects(_LedgerLostAfterSending(Database(settings.agent_db_path)), provider_terms(settings))

    @activity.defn(name="issue_refund")
    async def issue_refund(call: ToolInput) -> ToolResult:
        if activity.info().attempt == 1:
            await asyncio.to_thread(tools._issue_refund, call)
        raise ApplicationError("the ledger cannot be reached")
    return [issue_refund]


async def test_a_refund_that_ran_out_of_attempts_cannot_be_rejected(
    client: Client, settings: Settings, world: World, edge: EdgeControl,
):
    """The refund landed, then every attempt failed and the refunds cannot be listed: a person is asked.
    `reject` would tell the model nothing was done; it is not offered, and a signed reject is not kept.
    Once the provider can be read the task finds the refund and goes on without anyone."""
    edge.configure("dedupe", [
        {"method": "POST", "path": "/v1/refunds", "fault": "slow", "delay_seconds": 0.0, "nth": [1]},
        {"method": "GET", "path": "/v1/refunds", "fault": "fail", "after_rule": 0},
    ])
    async with running_worker(client, settings, replace=refunds_then_fails(settings)):
        handle = await start(client, settings, scenario_task("SU-88421"))
        asked = await waiting(handle)
        assert asked.waiting_for.reason == "attempts_exhausted", asked.waiting_for
        assert "reject" not in asked.waiting_for.allowed, asked.waiting_for.allowed
        await handle.signal("resolve", signed(handle.id, asked.waiting_for.intent_key, "reject"))
        refused = await decided(handle, "ignored")
        assert refused.waiting_for is not None and refused.state == "awaiting_human"
        edge.configure("dedupe")
        result = await finished(handle)
    [refund] = world.refunds("SU-88421")
    step = result.checkpoint.steps["issue_refund"]
    assert step.outcome is Outcome.PERFORMED and step.result["provider_ref"] == refund["id"], step.trail
    assert result.state == "completed" and [d.status for d in result.checkpoint.decisions] == ["ignored"]


def readable_as_asked(settings: Settings, edge: EdgeControl) -> list:
    """The activities that deliver an escalation's alert, each first making the provider readable (the
    refund that landed can be listed from then on): the world settles at the worst moment, after the
    workflow decided to ask and before the person is reached."""
    db = Database(settings.agent_db_path)
    tools = ToolActivities(db, StripeGateway(STRIPE_API_KEY, settings.stripe_api_base, settings.stripe_timeout_seconds),
                           Ceilings(settings.approval_ceiling_cents), provider_terms(settings))
    operations = OperationsActivities(db)

    @activity.defn(name="raise_alert")
    async def raise_alert(alert: AlertInput) -> str:
        if alert.kind == "escalation":
            await asyncio.to_thread(edge.configure, "passthrough")
        return await operations.raise_alert(alert)

    @activity.defn(name="ask_a_person")
    async def ask_a_person(ask: AskInput) -> AskAnswer:
        await asyncio.to_thread(edge.configure, "passthrough")
        return await AskingActivities(tools, operations, settings.unreadable_reads_before_asking).ask_a_person(ask)
    return [raise_alert, ask_a_person]


async def test_nobody_is_asked_when_the_world_settles_as_the_question_goes_out(
    client: Client, fast: Settings, world: World, edge: EdgeControl,
):
    """The refund landed and its answer was lost while the refunds could not be listed: an unknown
    outcome. The provider becomes readable just as the alert is to be delivered. The alert's own read
    finds the refund: no alert is delivered, the task completes with the one refund, nobody waits."""
    edge.configure("passthrough", LANDED_UNREADABLE)
    async with running_worker(client, fast, replace=readable_as_asked(fast, edge)):
        handle = await start(client, fast, scenario_task("SU-88421"))

        async def ended():
            cp = await checkpoint(handle)
            step = cp.steps.get("issue_refund")
            return cp if cp.waiting_for is not None or (step is not None and step.outcome in SETTLED) else None
        cp = await wait_for(ended, "the refund settled or a person asked", 120)
        assert cp.waiting_for is None, f"a person was asked: {cp.waiting_for}"
        result = await finished(handle)
    [refund] = world.refunds("SU-88421")
    step = result.checkpoint.steps["issue_refund"]
    assert step.outcome is Outcome.PERFORMED and step.result["provider_ref"] == refund["id"], step.trail
    assert result.state == "completed" and result.checkpoint.escalations == 0
    assert alert_kinds(fast, handle.id) == [], "an alert reached a person about a refund the provider held"
    assert_ledger_equals_provider(world, "SU-88421")


def readable_again_on_the_second_read(settings: Settings, edge: EdgeControl) -> list:
    """`ask_a_person` whose provider comes back (a restart ends) from its second attempt on."""
    db = Database(settings.agent_db_path)
    tools = ToolActivities(db, StripeGateway(STRIPE_API_KEY, settings.stripe_api_base, settings.stripe_timeout_seconds),
                           Ceilings(settings.approval_ceiling_cents), provider_terms(settings))

    @activity.defn(name="ask_a_person")
    async def ask_a_person(ask: AskInput) -> AskAnswer:
        if activity.info().attempt >= 2:
            await asyncio.to_thread(edge.configure, "passthrough")
        return await AskingActivities(tools, OperationsActivities(db), settings.unreadable_reads_before_asking).ask_a_person(ask)
    return [ask_a_person]


async def test_nobody_is_asked_while_the_provider_is_only_briefly_unreadable(
    client: Client, fast: Settings, world: World, edge: EdgeControl,
):
    """The refund landed and its answer was lost, and the provider cannot be read (as during its
    restart) when the task would ask. The provider is read again before anyone is asked; readable a
    second later, it shows the refund: nobody is asked, one refund, the customer told."""
    edge.configure("passthrough", LANDED_UNREADABLE)
    async with running_worker(client, fast, replace=readable_again_on_the_second_read(fast, edge)):
        result = await finished(await start(client, fast, scenario_task("SU-88421")))
    [refund] = world.refunds("SU-88421")
    step = result.checkpoint.steps["issue_refund"]
    assert result.state == "completed" and result.checkpoint.escalations == 0, step.trail
    assert step.outcome is Outcome.PERFORMED and step.result["provider_ref"] == refund["id"], step.trail
    assert alert_kinds(fast, result.task_id) == []
    assert_ledger_equals_provider(world, "SU-88421")


async def test_a_question_the_world_settles_while_a_person_is_asked_is_withdrawn(
    client: Client, settings: Settings, world: World, edge: EdgeControl,
):
    """Key-ignoring provider: the refund POST is held 25 s, far past its settle horizon (1 s timeout + 2 s
    window), so the task asks a person (`may_land_late`). Then the held request lands. The waiting task
    reads the world again, finds the refund and goes on without anyone: one refund, the customer told,
    the escalation's alert followed by a withdrawal, no decision needed."""
    short = settings.model_copy(update={"stripe_timeout_seconds": 1.0, "stripe_processing_window_seconds": 2.0})
    edge.configure("passthrough", [{"method": "POST", "path": "/v1/refunds", "fault": "slow", "delay_seconds": 25.0,
                                    "nth": [1]}])
    async with running_worker(client, short):
        handle = await start(client, short, scenario_task("SU-88421"))
        asked = await waiting(handle, timeout=60)
        assert asked.waiting_for.reason == "unknown_outcome" and world.refunds("SU-88421") == [], asked.waiting_for
        result = await finished(handle)
    [refund] = world.refunds("SU-88421")
    step = result.checkpoint.steps["issue_refund"]
    assert result.state == "completed" and step.outcome is Outcome.PERFORMED, step.trail
    assert step.result["provider_ref"] == refund["id"] and result.checkpoint.decisions == []
    assert any("settled by the world while a person was asked" in line for line in step.trail), step.trail
    [notice] = [m for m in world.messages(handle.id) if m["kind"] == "email"]
    assert "118.00" in notice["body"] and refund["id"] in notice["body"]
    kinds = alert_kinds(short, handle.id)
    assert kinds == ["escalation", "escalation_withdrawn"], kinds
    assert_ledger_equals_provider(world, "SU-88421")


def test_a_question_delivered_by_a_lost_attempt_is_withdrawn_when_the_next_finds_it_settled(
        settings: Settings, world: World, edge: EdgeControl, caplog: pytest.LogCaptureFixture):
    """An attempt of `ask_a_person` delivered its alert and its worker died before it answered; by the
    retry the refund is at the provider. The retry asks nobody and tells the person the question is
    withdrawn. A first attempt that finds the world settled, or a retry whose predecessor reached nobody,
    alerts nobody at all."""
    edge.configure("passthrough")
    db = Database(settings.agent_db_path)
    tools = ToolActivities(db, world.gateway, Ceilings(settings.approval_ceiling_cents), provider_terms(settings))
    operations = OperationsActivities(db)
    asking = AskingActivities(tools, operations, settings.unreadable_reads_before_asking)
    call = ToolInput(task_id="ask-lost", tool="issue_refund", intent_key="v1:issue_refund:ask-lost",
                     arguments={"order_id": "ORD-8841", "item_id": "kettle-01", "amount_cents": 4500,
                                "currency": "usd", "reason": "damaged"})
    assert attempt(1).run(tools._issue_refund, call).outcome is Outcome.PERFORMED

    def ask(key: str) -> AskInput:
        return _question(call, key)

    def kinds() -> list[tuple[str, str]]:
        with db.connect() as conn:
            rows = conn.execute("SELECT alert_key, kind FROM alerts WHERE task_id = :task ORDER BY created_at",
                                {"task": call.task_id}).fetchall()
        return [(r["alert_key"], r["kind"]) for r in rows]

    assert not asyncio.run(attempt(1).run(asking.ask_a_person, ask("q1"))).asked
    assert not asyncio.run(attempt(2).run(asking.ask_a_person, ask("q2"))).asked
    assert kinds() == [], "nobody was reached before: nothing to withdraw"

    asyncio.run(operations.raise_alert(ask("q3").alert))  # what the lost attempt delivered
    answer = asyncio.run(attempt(2).run(asking.ask_a_person, ask("q3")))
    assert not answer.asked and answer.world.status == "performed"
    assert kinds() == [("q3", "escalation"), ("q3:withdrawn", "escalation_withdrawn")]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="agent.alerts"):
        asyncio.run(attempt(3).run(asking.ask_a_person, ask("q3")))
    assert [r for r in caplog.records if "escalation_withdrawn" in r.getMessage()] == [], "delivered once"
    assert kinds() == [("q3", "escalation"), ("q3:withdrawn", "escalation_withdrawn")], "withdrawn once"
    [refund] = world.refunds("ORD-8841")
    assert refund["intent_key"] == call.intent_key


# --- 3. a task's own ceiling counts totals ----------------------------------------------------------


async def test_a_tasks_own_ceiling_counts_its_refunds_in_total(client: Client, settings: Settings, world: World):
    """A task whose input lowers its ceiling to 5,000 cents: 4,000 + 4,000 + 4,000 on three items is
    one refund, then a person is asked; rejected, nothing more is paid."""
    order = fresh_order(world, [("cup", 4000), ("saucer", 4000), ("plate", 4000)])
    task = scripted(order.order_id, "cup", [refund_call(order.order_id, i, 4000) for i in ("cup", "saucer", "plate")])
    task = task.model_copy(update={"refund_ceiling_cents": 5000, "facts": {"order_id": order.order_id}})
    async with running_worker(client, settings):
        handle = await start(client, settings, task)
        cp = await waiting(handle)
        assert cp.waiting_for.reason == "approval_required", cp.waiting_for
        assert "5000" in cp.waiting_for.detail and refunds_of(world, order.order_id) == [4000]
        first = cp.waiting_for.intent_key
        await handle.signal("resolve", signed(handle.id, first, "reject"))

        async def next_question():
            cp = await checkpoint(handle)
            return cp if cp.waiting_for and cp.waiting_for.intent_key != first else None
        cp = await wait_for(next_question, "the third refund's question", 60)
        assert cp.waiting_for.reason == "approval_required" and refunds_of(world, order.order_id) == [4000]
        await handle.signal("resolve", signed(handle.id, cp.waiting_for, "reject"))  # question 2
        result = await finished(handle)
    assert refunds_of(world, order.order_id) == [4000]
    assert result.checkpoint.escalations == 2


# --- 5. the send-by check is the last thing before the bytes ---------------------------------------


def test_a_request_past_its_send_by_time_never_reaches_the_provider(settings: Settings, edge: EdgeControl,
                                                                   world: World):
    """The real SDK over HTTP: the connection may be open, the check still refuses the bytes."""
    before = edge.stats().get("POST /v1/refunds", 0)
    record = world.records.order("SU-88421")
    gateway = StripeGateway(STRIPE_API_KEY, settings.stripe_api_base, 5.0)
    gateway.ping()  # a pooled connection is open
    with send_before(time.time() - 0.001), pytest.raises(NotSent):
        gateway.refund(record.payment_intent_id, 100, "late-key", {"order_id": "SU-88421"})
    assert edge.stats().get("POST /v1/refunds", 0) == before
    assert refunds_of(world, "SU-88421") == []
    with send_before(time.time() + 30):
        gateway.refund(record.payment_intent_id, 100, "on-time-key", {"order_id": "SU-88421"})
    assert refunds_of(world, "SU-88421") == [100]



def test_a_request_paused_between_its_headers_and_its_body_never_reaches_the_provider(
        settings: Settings, world: World, monkeypatch: pytest.MonkeyPatch):
    """urllib3 writes a request's headers, then its body: a worker paused between the two (here its send-by
    time passes right after the headers) writes no body, and the provider never acts on the half request."""
    record = world.records.order("SU-88421")
    gateway = StripeGateway(STRIPE_API_KEY, settings.stripe_api_base, 5.0)
    headers_only = urllib3.connection.HTTPConnection.endheaders

    def then_paused(self: urllib3.connection.HTTPConnection, *args: object, **kwargs: object) -> None:
        headers_only(self, *args, **kwargs)
        payments._send_by.set(time.time() - 0.001)  # the pause outlasts the send-by time

    monkeypatch.setattr(urllib3.connection.HTTPConnection, "endheaders", then_paused)
    with send_before(time.time() + 30), pytest.raises(NotSent, match="body"):
        gateway.refund(record.payment_intent_id, 100, "paused-key", {"order_id": "SU-88421"})
    monkeypatch.undo()
    assert refunds_of(world, "SU-88421") == []
    with send_before(time.time() + 30):
        gateway.refund(record.payment_intent_id, 100, "on-time-key", {"order_id": "SU-88421"})
    assert refunds_of(world, "SU-88421") == [100], "the pool's next request goes out whole"


def _question(call: ToolInput, key: str) -> AskInput:
    return AskInput(intent={"task_id": call.task_id, "tool": call.tool, "intent_key": call.intent_key,
                            "arguments": call.arguments},
                    alert=AlertInput(alert_key=key, task_id=call.task_id, kind="escalation",
                                     reason="unknown_outcome", intent_key=call.intent_key, summary="asked"))


async def test_a_question_whose_worker_died_after_its_post_is_withdrawn(settings: Settings, world: World,
                                                                       edge: EdgeControl):
    """The lost attempt's POST reached the person's webhook, and its worker died before the webhook
    answered. The alert's row was written before it left, so the retry, finding the refund at the
    provider, tells the same webhook the question is withdrawn."""
    received: list[dict] = []
    first_in, release = asyncio.Event(), asyncio.Event()

    async def alert(request: web.Request) -> web.Response:
        received.append(await request.json())
        if len(received) == 1:
            first_in.set()
            await release.wait()  # no answer before the attempt is gone
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/alerts", alert)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        edge.configure("passthrough")
        db = Database(settings.agent_db_path)
        tools = ToolActivities(db, world.gateway, Ceilings(settings.approval_ceiling_cents), provider_terms(settings))
        operations = OperationsActivities(db, f"http://127.0.0.1:{port}/alerts")
        asking = AskingActivities(tools, operations, settings.unreadable_reads_before_asking)
        call = ToolInput(task_id="ask-died", tool="issue_refund", intent_key="v1:issue_refund:ask-died",
                         arguments={"order_id": "ORD-8841", "item_id": "kettle-01", "amount_cents": 4500,
                                    "currency": "usd", "reason": "damaged"})
        assert (await asyncio.to_thread(attempt(1).run, tools._issue_refund, call)).outcome is Outcome.PERFORMED

        lost = asyncio.ensure_future(operations.raise_alert(_question(call, "q1").alert))
        await asyncio.wait_for(first_in.wait(), timeout=30)
        lost.cancel()  # the worker is gone: nothing after the POST runs
        answer = await attempt(2).run(asking.ask_a_person, _question(call, "q1"))
    finally:
        release.set()
        await runner.cleanup()
    assert not answer.asked and answer.world.status == "performed"
    assert [(b["alert_key"], b["kind"]) for b in received] == [("q1", "escalation"),
                                                              ("q1:withdrawn", "escalation_withdrawn")]
    assert [r["intent_key"] for r in world.refunds("ORD-8841")] == [call.intent_key]


async def test_a_refund_the_provider_failed_is_not_put_to_a_person_again(
    client: Client, settings: Settings, world: World, edge: EdgeControl,
):
    """Over the ceiling: a person approves, and the provider makes the refund and fails it at once. The model
    keeps asking for the same refund, past the task's asks: the records settle it (nothing was done, and
    sending it again makes nothing), so nobody is asked a second time and no second request goes out."""
    strict = settings.model_copy(update={"approval_ceiling_cents": 10000, "stripe_honours_keys": True})
    edge.configure("dedupe", [{"method": "POST", "path": "/v1/refunds", "fault": "refund_failed", "nth": [1]}])
    order = fresh_order(world, [("sofa", 20000)])
    call = refund_call(order.order_id, "sofa", 15000)
    task = scripted(order.order_id, "sofa", [dict(call) for _ in range(4)], name="failed-twice").model_copy(
        update={"max_asks_per_call": 2})
    async with running_worker(client, strict):
        handle = await start(client, strict, task)
        asked = await waiting(handle)
        assert asked.waiting_for.reason == "approval_required"
        await handle.signal("resolve", signed(handle.id, asked.waiting_for.intent_key, "approve"))
        result = await finished(handle)
    cp = result.checkpoint
    assert result.state == "completed" and cp.escalations == 1, cp.waiting_for
    assert [r["status"] for r in world.refunds(order.order_id)] == ["failed"]
    assert edge.stats().get("POST /v1/refunds") == 1, "the failed refund was not asked for again"
    assert [s.reason for s in cp.steps.values() if s.tool == "issue_refund"] == ["provider_failed"]
    assert alert_kinds(strict, handle.id) == ["escalation"], "one person was asked, once"
