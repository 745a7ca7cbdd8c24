"""A human's "it was performed" (or "it was not") is checked against the provider before the ledger
keeps it: a made-up or mismatched provider reference is refused with the reason. Once the provider
can be read again it settles the call itself, and nobody is asked again; the customer is told only
what happened."""

from __future__ import annotations

import pytest
from temporalio.client import Client, WorkflowHandle

from activities.world import World
from core.models import Checkpoint, Outcome
from devstack.edge_control import EdgeControl
from infra.settings import Settings
from tests.approvers import signed
from tests.helpers import checkpoint, finished, running_worker, scenario_task, start, wait_for, waiting

NOTHING_HAPPENED = [  # the refund never reaches the provider, and nobody can read its refunds
    {"method": "POST", "path": "/v1/refunds", "fault": "error_before_commit", "nth": [1]},
    {"method": "GET", "path": "/v1/refunds", "fault": "fail", "after_rule": 0},
]
HAPPENED = [  # the refund lands, the client times out, and nobody can read its refunds
    {"method": "POST", "path": "/v1/refunds", "fault": "timeout_after_accept", "nth": [1], "delay_seconds": 2.0},
    {"method": "GET", "path": "/v1/refunds", "fault": "fail", "after_rule": 0},
]


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return settings.model_copy(update={"stripe_timeout_seconds": 1.0})


async def refused(handle: WorkflowHandle, count: int) -> Checkpoint:
    """The checkpoint once `count` human decisions were refused by the provider check."""
    async def check():
        cp = await checkpoint(handle)
        done = [d for d in cp.decisions if d.via == "provider_check" and d.status == "refused"]
        return cp if len(done) >= count else None
    return await wait_for(check, f"{count} decisions refused by the provider check", 60)


async def test_mark_performed_with_a_made_up_reference_is_refused_when_nothing_happened(
    client: Client, fast: Settings, world: World, edge: EdgeControl,
):
    edge.configure("passthrough", NOTHING_HAPPENED)
    async with running_worker(client, fast):
        handle = await start(client, fast, scenario_task("SU-88421"))
        key = (await waiting(handle)).waiting_for.intent_key
        edge.configure("passthrough")
        await handle.signal("resolve", signed(handle.id, key, "mark_performed", provider_ref="re_made_up"))
        cp = await refused(handle, 1)
        assert "the provider has no effect re_made_up" in cp.decisions[-1].why
        result = await finished(handle)
    assert [r["amount_cents"] for r in world.refunds("SU-88421")] == [11800], "the retry refunded it once"
    step = result.checkpoint.steps["issue_refund"]
    assert step.outcome is Outcome.PERFORMED
    assert result.checkpoint.escalations == 1, "the provider, readable again, settled it: nobody was asked twice"
    assert any("read from the ledger and the provider" in line for line in step.trail), step.trail


async def test_mark_performed_under_another_refunds_id_is_refused(client: Client, fast: Settings, world: World,
                                                                 edge: EdgeControl):
    """The refund happened as one id; the human names another real refund (of another order), then the
    wrong amount's worth of nothing, then says it did not happen: each refused. The right id applies."""
    other = world.records.order("ORD-8841")
    elsewhere = world.gateway.refund(other.payment_intent_id, 4500, "by-hand-2", {"order_id": "ORD-8841"})
    edge.configure("passthrough", HAPPENED)
    async with running_worker(client, fast):
        handle = await start(client, fast, scenario_task("SU-88421"))
        key = (await waiting(handle)).waiting_for.intent_key
        edge.configure("passthrough")
        [refund] = world.refunds("SU-88421")
        await handle.signal("resolve", signed(handle.id, key, "mark_performed", provider_ref=elsewhere.id))
        cp = await refused(handle, 1)
        assert f"holds this intent as {refund['id']}" in cp.decisions[-1].why
        result = await finished(handle)
    assert [r["id"] for r in world.refunds("SU-88421")] == [refund["id"]]
    [row] = [e for e in world.effects(handle.id) if e["tool"] == "issue_refund"]
    assert (row["status"], row["provider_ref"]) == ("performed", refund["id"])
    assert result.state == "completed" and result.checkpoint.escalations == 1
    assert result.checkpoint.steps["issue_refund"].result["provider_ref"] == refund["id"]
