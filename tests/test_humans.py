"""Escalations, approvals and decisions end to end on the dev server, judged on the provider's
refunds, the ledger and the recorded decisions."""

from __future__ import annotations

import pytest
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError

from activities.db import Database
from activities.operations import alerts
from activities.world import World
from core.keys import derive_intent_key
from core.models import DecisionReceipt, Outcome, ResolveInput
from core.tools import REGISTRY
from devstack.edge_control import EdgeControl, preset
from infra.settings import Settings
from tests.approvers import ALICE, signed
from tests.helpers import checkpoint, finished, run, running_worker, scenario_task, start, wait_for, waiting


@pytest.fixture
def strict(settings: Settings) -> Settings:
    """A ceiling below SU-88421's $118.00, so its refund needs a human approval."""
    return settings.model_copy(update={"approval_ceiling_cents": 10000, "stripe_timeout_seconds": 1.0})


def decision(handle, key: str, what: str, by: str = ALICE, **extra) -> dict:
    return signed(handle.id, key, what, by=by, **extra)


async def test_unknown_refund_is_found_by_its_search_attribute_and_resolved_by_signal(
    client: Client, settings: Settings, world: World, edge: EdgeControl,
):
    fast = settings.model_copy(update={"stripe_timeout_seconds": 1.0})
    edge.configure("passthrough", preset("unverifiable", "/v1/refunds", 1.0))
    task = scenario_task("SU-88421")
    async with running_worker(client, fast):
        handle = await start(client, fast, task)
        cp = await waiting(handle)
        assert cp.waiting_for.reason == "unknown_outcome"

        async def listed():
            query = f'AgentStatus="awaiting_human" AND AgentEscalation="unknown_outcome" AND WorkflowId="{task.task_id}"'
            return [w async for w in client.list_workflows(query)]
        await wait_for(listed, "the visibility query to list the waiting task")

        edge.configure("passthrough")
        [refund] = world.refunds("SU-88421")
        await handle.signal("resolve", decision(handle, cp.waiting_for.intent_key, "mark_performed", provider_ref=refund["id"]))
        result = await finished(handle)

    assert result.state == "completed"
    assert len(world.refunds("SU-88421")) == 1
    [effect] = [e for e in world.effects(task.task_id) if e["tool"] == "issue_refund"]
    assert (effect["status"], effect["provider_ref"]) == ("performed", refund["id"])
    [record] = result.checkpoint.decisions
    assert record.status == "applied" and record.decision.decided_by == "alice@example.com"
    history = await handle.fetch_history()
    signals = [e for e in history.events if e.HasField("workflow_execution_signaled_event_attributes")]
    assert b"alice@example.com" in signals[0].workflow_execution_signaled_event_attributes.input.payloads[0].data
    assert [a["reason"] for a in alerts(Database(settings.agent_db_path), task.task_id)] == ["unknown_outcome"]


async def test_over_ceiling_refund_approved_by_update_pays_once(client: Client, strict: Settings, world: World):
    task = scenario_task("SU-88421")
    async with running_worker(client, strict):
        handle = await start(client, strict, task)
        cp = await waiting(handle)
        assert cp.waiting_for.reason == "approval_required" and world.refunds("SU-88421") == []
        receipt = await handle.execute_update(
            "decide", ResolveInput(**decision(handle, cp.waiting_for.intent_key, "approve")), result_type=DecisionReceipt)
        assert receipt.decision == "approve" and receipt.intent_key == cp.waiting_for.intent_key
        result = await finished(handle)
    refunds = world.refunds("SU-88421")
    assert [r["amount_cents"] for r in refunds] == [11800]
    assert world.gateway.find_refund(world.records.order("SU-88421").payment_intent_id,
                                     refunds[0]["intent_key"]).metadata["approved_by"] == "alice@example.com"
    assert result.checkpoint.steps["issue_refund"].outcome is Outcome.PERFORMED


async def test_over_ceiling_refund_rejected_pays_nothing(client: Client, strict: Settings, world: World):
    task = scenario_task("SU-88421")
    async with running_worker(client, strict):
        handle = await start(client, strict, task)
        cp = await waiting(handle)
        await handle.signal("resolve", decision(handle, cp.waiting_for.intent_key, "reject"))
        result = await finished(handle)
    assert world.refunds("SU-88421") == []
    step = result.checkpoint.steps["issue_refund"]
    assert (step.outcome, step.reason) == (Outcome.NOT_PERFORMED, "rejected_by_human")
    assert world.messages(task.task_id) == [], "nobody is told of a refund that was not made"
    assert result.state == "completed"


async def test_a_decision_for_another_call_or_malformed_changes_nothing(client: Client, strict: Settings,
                                                                       world: World):
    task = scenario_task("SU-88421")
    spec = REGISTRY["issue_refund"]
    edited = derive_intent_key(spec.name, spec.key_fields, {"order_id": "SU-88421", "item_id": "oak-shelf-4",
                                                            "amount_cents": 11700}, {"task_id": task.task_id})
    async with running_worker(client, strict):
        handle = await start(client, strict, task)
        cp = await waiting(handle)
        key = cp.waiting_for.intent_key
        await handle.signal("resolve", decision(handle, edited, "approve"))
        await handle.signal("resolve", "approve it please")
        await handle.signal("resolve", {"intent_key": key, "decision": "approve"})
        await handle.signal("resolve", decision(handle, key, "mark_performed"))
        with pytest.raises(WorkflowUpdateFailedError) as refused:  # answered by the validator, not recorded
            await handle.execute_update("decide", ResolveInput(**decision(handle, edited, "approve")))
        assert "no call with key" in str(refused.value.cause)
        cp = await wait_for(lambda: _decisions(handle, 4), "four recorded decisions")
        assert [d.status for d in cp.decisions] == ["ignored"] * 4
        assert "no call with key" in cp.decisions[0].why and "a JSON object" in cp.decisions[1].why
        assert "malformed" in cp.decisions[2].why
        assert "does not apply to approval_required" in cp.decisions[3].why
        assert cp.state == "awaiting_human" and world.refunds("SU-88421") == []
        await handle.signal("resolve", decision(handle, key, "approve"))
        result = await finished(handle)
    assert len(world.refunds("SU-88421")) == 1
    assert [d.status for d in result.checkpoint.decisions] == ["ignored"] * 4 + ["applied"]


async def test_model_escalation_waits_and_continues_on_approval(client: Client, settings: Settings, world: World):
    """A refund the tool refuses for good (more than the item cost) makes the model ask a human."""
    task = scenario_task("SU-88421", amount_cents=50000)
    async with running_worker(client, settings):
        handle = await start(client, settings, task)
        cp = await waiting(handle)
        assert cp.waiting_for.reason == "model_request" and cp.waiting_for.tool == "escalate_to_human"
        await handle.signal("resolve", decision(handle, cp.waiting_for.intent_key, "approve", note="I will call the buyer"))
        result = await finished(handle)
    assert result.state == "completed" and world.refunds("SU-88421") == []
    assert result.checkpoint.steps["issue_refund"].reason == "exceeds_item_price"


async def _decisions(handle, count: int):
    cp = await checkpoint(handle)
    return cp if len(cp.decisions) >= count else None


async def test_unusable_model_replies_go_back_as_errors_then_escalate(client: Client, settings: Settings,
                                                                     world: World):
    task = scenario_task("SU-88421", bad_calls=3)
    async with running_worker(client, settings):
        handle = await start(client, settings, task)
        cp = await waiting(handle)
        assert cp.waiting_for.reason == "unusable_model_output" and world.refunds("SU-88421") == []
        reasons = [s.reason for s in cp.steps.values()]
        assert reasons == ["unknown_tool", "malformed_arguments", "invalid_arguments"]
        await handle.signal("resolve", decision(handle, cp.waiting_for.intent_key, "approve", note="one more try"))
        result = await finished(handle)
    assert result.state == "completed" and len(world.refunds("SU-88421")) == 1


async def test_a_wait_on_unusable_model_replies_goes_on_in_the_run_a_junk_signal_rolls_it_into(
        client: Client, settings: Settings, world: World):
    """A junk signal rolls the wait on the model's unusable replies over into a new run: the new run still
    waits for the person, and the model is asked nothing more until they approve."""
    task = scenario_task("SU-88421", bad_calls=3).model_copy(update={"max_history_bytes": 200_000})
    async with running_worker(client, settings):
        handle = await start(client, settings, task)
        asked = await waiting(handle)
        assert asked.waiting_for.reason == "unusable_model_output"
        await handle.signal("resolve", "x" * 300_000)

        async def rolled_over():
            try:
                cp = await checkpoint(handle)
            except RPCError:  # a continue-as-new that met newer signals is retried by the server meanwhile
                return None
            return cp if cp.runs > 1 else None
        cp = await wait_for(rolled_over, "the wait to go on in a fresh run", 120)
        assert cp.state == "awaiting_human" and cp.waiting_for is not None, (cp.state, cp.waiting_for)
        assert cp.waiting_for.intent_key == asked.waiting_for.intent_key and cp.escalations == 1
        assert cp.turns == asked.turns and world.refunds("SU-88421") == [], "the model was asked nothing more"
        await handle.signal("resolve", decision(handle, cp.waiting_for.intent_key, "approve", note="one more try"))
        result = await finished(handle)
    assert result.state == "completed" and len(world.refunds("SU-88421")) == 1


async def test_a_few_unusable_replies_are_answered_and_the_task_goes_on(client: Client, settings: Settings,
                                                                       world: World):
    async with running_worker(client, settings):
        result = await run(client, settings, scenario_task("SU-88421", bad_calls=2))
    assert result.state == "completed" and result.checkpoint.escalations == 0
    assert len(world.refunds("SU-88421")) == 1
