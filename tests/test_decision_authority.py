"""Issue 22, item 6, end to end: a decision's lifetime is capped by the worker, a decision is used once
across runs and redrives (its nonce is kept in the ledger's database), and the approvers that count
are the worker's at the moment of deciding. Judged on the provider's refunds and the recorded
decisions."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from activities.authority import decision_nonces
from activities.db import Database
from activities.world import World
from client import redrive
from core.models import ResolveInput, ToolInput, ToolResult
from devstack.edge_control import EdgeControl
from infra.settings import Settings
from tests.approvers import ALICE, APPROVERS, BOB, signed
from tests.helpers import checkpoint, running_worker, scenario_task, start, wait_for, waiting

ONLY_ALICE = APPROVERS.split(",")[0]
ONLY_BOB = APPROVERS.split(",")[1]
assert ONLY_ALICE.startswith(ALICE + "=") and ONLY_BOB.startswith(BOB + "=")


@pytest.fixture
def strict(settings: Settings) -> Settings:
    """A refund ceiling below SU-88421's $118.00: its refund waits for an approval."""
    return settings.model_copy(update={"approval_ceiling_cents": 10000, "stripe_timeout_seconds": 1.0})


async def recorded(handle: WorkflowHandle, count: int):
    async def enough():
        cp = await checkpoint(handle)
        return cp if sum(cp.decision_counts.values()) >= count else None
    return await wait_for(enough, f"{count} recorded decisions")


# --- (a) the worker caps a decision's lifetime ---------------------------------------------------

async def test_a_decision_signed_for_ten_years_is_refused_and_recorded(client: Client, strict: Settings,
                                                                       world: World):
    task = scenario_task("SU-88421")
    async with running_worker(client, strict):
        handle = await start(client, strict, task)
        cp = await waiting(handle)
        key = cp.waiting_for.intent_key
        forever = signed(handle.id, key, "approve", valid_for=timedelta(days=3650))
        await handle.signal("resolve", forever)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update("decide", ResolveInput(**signed(handle.id, key, "approve",
                                                                        valid_for=timedelta(days=3650))))
        assert "valid for at most 4 h" in str(refused.value.cause)
        cp = await recorded(handle, 2)
        assert [(d.via, d.status) for d in cp.decisions] == [("signal", "refused"), ("update", "refused")]
        assert cp.decisions[0].decision.signature == forever["signature"]
        assert "valid for at most 4 h (DECISION_MAX_LIFETIME_SECONDS)" in cp.decisions[0].why, cp.decisions[0].why
        assert cp.state == "awaiting_human" and world.refunds("SU-88421") == []
        assert decision_nonces(Database(strict.agent_db_path), task.task_id) == []

        await handle.signal("resolve", signed(handle.id, key, "approve", valid_for=timedelta(hours=3)))
        result = await asyncio.wait_for(handle.result(), 120)
    assert [r["amount_cents"] for r in world.refunds("SU-88421")] == [11800]
    assert [d.status for d in result.checkpoint.decisions] == ["refused", "refused", "applied"]


# --- (b) a decision is used once across runs and redrives ----------------------------------------

@activity.defn(name="issue_refund")
async def refund_service_down(call: ToolInput) -> ToolResult:
    raise ApplicationError("the refund service is down", non_retryable=True)


async def test_a_decision_applied_before_a_redrive_is_refused_after_it(client: Client, settings: Settings,
                                                                       world: World):
    """Run 1: Alice approves the over-ceiling refund; the refund service is down, nobody answers the
    next escalation within the task's deadline, the task is a dead letter with nothing refunded.
    Run 2 (the redrive: the same workflow id, a new run) waits for an approval of the same call:
    Alice's old approval, replayed by whoever copied it from the first run's history, is refused;
    a new one pays once."""
    task = scenario_task("SU-88421").model_copy(update={"refund_ceiling_cents": 10000,
                                                        "escalation_timeout_seconds": 10})
    async with running_worker(client, settings, replace=[refund_service_down]):
        handle = await start(client, settings, task)
        cp = await waiting(handle)
        assert cp.waiting_for.reason == "approval_required"
        key = cp.waiting_for.intent_key
        approval = signed(handle.id, key, "approve")
        await handle.signal("resolve", approval)
        first = await asyncio.wait_for(handle.result(), 90)  # the refund fails; the next wait passes its deadline
    assert first.state == "dead_lettered" and "no decision on" in first.final_answer, first.final_answer
    assert [d.status for d in first.checkpoint.decisions] == ["applied"]
    assert world.refunds("SU-88421") == []
    [row] = decision_nonces(Database(settings.agent_db_path), task.task_id)
    assert (row["nonce"], row["intent_key"], row["decided_by"]) == (approval["nonce"], key, ALICE)
    assert row["first_seen_by"].startswith(f"{task.task_id}/{handle.result_run_id}/"), row["first_seen_by"]

    async with running_worker(client, settings):
        again, _, was = await redrive(client, settings, task.task_id, escalation_timeout_seconds=3600)
        assert was == "dead_lettered" and again.id == handle.id and again.result_run_id != handle.result_run_id
        cp = await waiting(again)
        assert (cp.waiting_for.reason, cp.waiting_for.intent_key) == ("approval_required", key)
        await again.signal("resolve", approval)  # the first run's approval, replayed
        cp = await recorded(again, 1)
        [replayed] = cp.decisions
        assert (replayed.status, replayed.decision.nonce) == ("refused", approval["nonce"])
        assert "this decision was used already" in replayed.why, replayed.why
        assert cp.state == "awaiting_human" and world.refunds("SU-88421") == []

        await again.signal("resolve", signed(handle.id, key, "approve"))
        redriven = await asyncio.wait_for(again.result(), 120)
    assert redriven.state == "completed"
    assert [r["amount_cents"] for r in world.refunds("SU-88421")] == [11800]
    assert [d.status for d in redriven.checkpoint.decisions] == ["refused", "applied"]


# --- (c) the approvers are the worker's at the moment of deciding --------------------------------

async def test_an_approver_removed_from_the_worker_after_the_task_started_cannot_decide(
    client: Client, strict: Settings, world: World,
):
    """The task started while Alice and Bob were approvers; the worker now trusts Bob only. Alice's
    signed approval passes the workflow's screen (its policy still names her) and is refused by
    verify_decision, which checks the worker's current keys."""
    task = scenario_task("SU-88421")
    async with running_worker(client, strict):
        handle = await start(client, strict, task)
        cp = await waiting(handle)
        assert cp.policy.approvers == [ALICE, BOB]
    without_alice = strict.model_copy(update={"approvers": ONLY_BOB})
    async with running_worker(client, without_alice):
        key = cp.waiting_for.intent_key
        await handle.signal("resolve", signed(handle.id, key, "approve", by=ALICE))
        cp = await recorded(handle, 1)
        assert (cp.decisions[0].status, cp.decisions[0].why) == (
            "refused", f"{ALICE!r} is not an approver on this worker")
        assert world.refunds("SU-88421") == []
        await handle.signal("resolve", signed(handle.id, key, "approve", by=BOB))
        result = await asyncio.wait_for(handle.result(), 120)
    assert [r["amount_cents"] for r in world.refunds("SU-88421")] == [11800]
    assert result.checkpoint.decisions[-1].decision.decided_by == BOB


async def test_an_approver_added_to_the_worker_after_the_task_started_can_decide(
    client: Client, strict: Settings, world: World,
):
    task = scenario_task("SU-88421")
    alice_only = strict.model_copy(update={"approvers": ONLY_ALICE})
    async with running_worker(client, alice_only):
        handle = await start(client, alice_only, task)
        cp = await waiting(handle)
        assert cp.policy.approvers == [ALICE]
    async with running_worker(client, strict):  # Bob is added
        await handle.signal("resolve", signed(handle.id, cp.waiting_for.intent_key, "approve", by=BOB))
        cp = await recorded(handle, 1)
        assert cp.decisions[0].status == "applied", cp.decisions[0].why
        result = await asyncio.wait_for(handle.result(), 120)
    assert [r["amount_cents"] for r in world.refunds("SU-88421")] == [11800]
    assert result.checkpoint.decisions[-1].decision.decided_by == BOB


# --- (d) a decision answers one question ------------------------------------------------------------

LANDS_UNSEEN = [  # the refund lands, the client times out, and nobody can read the provider's refunds
    {"method": "POST", "path": "/v1/refunds", "fault": "timeout_after_accept", "nth": [1], "delay_seconds": 2.0},
    {"method": "GET", "path": "/v1/refunds", "fault": "fail", "after_rule": 0},
]


async def test_an_approval_of_a_refunds_size_is_not_taken_as_a_retry_after_its_outcome_is_lost(
    client: Client, strict: Settings, world: World, edge: EdgeControl,
):
    """Alice and Bob both approve question 1 (the refund is over the ceiling). Alice's lands first; the
    refund's answer is lost and the task asks question 2 about the same call (its outcome is unknown), where
    `approve` means "send it again". Bob's approval arrives then: it answers question 1 and is ignored,
    not applied as a retry nobody decided on. A decision naming no question, or one re-pointed at
    another after signing, is refused."""
    edge.configure("passthrough", LANDS_UNSEEN)  # (a world read through the edge fails while it holds)
    async with running_worker(client, strict):
        handle = await start(client, strict, scenario_task("SU-88421"))
        first = (await waiting(handle)).waiting_for
        assert (first.reason, first.question) == ("approval_required", 1), first
        unbound = signed(handle.id, first.intent_key, "approve", question=None)
        repointed = {**signed(handle.id, first.intent_key, "approve", question=2), "question": 1}
        ahead = signed(handle.id, first.intent_key, "approve", question=2)
        for decision in (unbound, repointed, ahead):
            await handle.signal("resolve", decision)
        cp = await recorded(handle, 3)
        answers = {d.decision.nonce: (d.status, d.why or "") for d in cp.decisions if d.decision}
        status, why = answers[unbound["nonce"]]
        assert status == "refused" and why.startswith("it names no question"), why
        status, why = answers[repointed["nonce"]]
        assert status == "refused" and "signature" in why, why
        status, why = answers[ahead["nonce"]]
        assert status == "ignored" and why.startswith("it answers question 2 about this call"), why
        assert edge.stats().get("POST /v1/refunds", 0) == 0 and cp.waiting_for.question == 1

        bobs = signed(handle.id, first, "approve", by=BOB)
        await handle.signal("resolve", signed(handle.id, first, "approve", by=ALICE))

        async def asked_again():
            cp = await checkpoint(handle)
            return cp if cp.waiting_for is not None and cp.waiting_for.question == 2 else None
        second = (await wait_for(asked_again, "the question about the refund's lost outcome", 120)).waiting_for
        assert second.intent_key == first.intent_key and "approve" in second.allowed, second
        posts = edge.stats().get("POST /v1/refunds", 0)

        await handle.signal("resolve", bobs)
        cp = await recorded(handle, 5)
        assert (cp.decisions[-1].status, cp.decisions[-1].decision.decided_by) == ("ignored", BOB), cp.decisions[-1]
        assert "answers question 1" in cp.decisions[-1].why and "question 2" in cp.decisions[-1].why
        assert cp.waiting_for is not None and cp.waiting_for.question == 2, "still asking question 2"
        assert edge.stats().get("POST /v1/refunds", 0) == posts, "Bob's approval sent nothing"

        edge.configure("passthrough")  # the provider can be read again: the refund landed once
        [refund] = world.refunds("SU-88421")
        await handle.signal("resolve", signed(handle.id, second, "mark_performed", provider_ref=refund["id"]))
        result = await asyncio.wait_for(handle.result(), 120)
    assert [r["id"] for r in world.refunds("SU-88421")] == [refund["id"]]
    assert result.state == "completed" and result.checkpoint.escalations == 2
