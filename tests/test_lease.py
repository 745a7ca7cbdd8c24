"""Fencing of the intent: an attempt that holds an intent (a worker paused between its ledger claim
and its provider call) makes the next attempt wait for its settle horizon, not send; once it is taken
over, the paused attempt's ledger writes change nothing. Against a provider that ignores idempotency
keys this is what keeps a paused worker from paying a second time (end to end: test_money_boundary)."""

from __future__ import annotations

import dataclasses
import time

import pytest
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.db import Database
from activities.effects import ProviderTerms
from activities.ledger import Claimed, EffectLedger, Hold, Request
from activities.tools import ToolActivities
from activities.world import World
from core.authority import Ceilings
from core.keys import derive_intent_key
from core.models import Outcome, ToolInput
from core.tools import REGISTRY
from devstack.edge_control import EdgeControl
from infra.settings import Settings


def attempt(n: int) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=n, workflow_id="refund-lease", activity_id="4",
                                   retry_policy=RetryPolicy(maximum_attempts=3))
    return env


def test_a_held_intent_is_not_sent_twice(settings: Settings, world: World, edge: EdgeControl):
    edge.configure("passthrough")
    db = Database(settings.database)
    tools = ToolActivities(db, world.gateway, Ceilings(15000),
                           terms=ProviderTerms(request_timeout_seconds=5, processing_window_seconds=30))
    spec = REGISTRY["issue_refund"]
    args = {"order_id": "ORD-8841", "item_id": "kettle-01", "amount_cents": 4500, "currency": "usd", "reason": "x"}
    key = derive_intent_key(spec.name, spec.key_fields, args, {"task_id": "refund-lease"})
    call = ToolInput(task_id="refund-lease", tool="issue_refund", arguments=args, intent_key=key)
    ledger = EffectLedger(db)
    first = attempt(1)
    now = time.time()
    held = first.run(lambda: ledger.claim(Request(
        intent_key=key, task_id=call.task_id, tool=call.tool, arguments=args, owner="refund-lease/run/4", attempt=1,
        amount_cents=4500, holds=(Hold("item:ORD-8841/kettle-01", 4500, 4500), Hold("order:ORD-8841", 6900, 4500)),
        lease_until=now + 5, horizon=now + 40)))
    assert isinstance(held, Claimed)

    with pytest.raises(ApplicationError) as waited:
        attempt(2).run(tools._issue_refund, call)
    assert waited.value.type == "OutcomeUnverified" and waited.value.next_retry_delay.total_seconds() > 35
    assert world.refunds("ORD-8841") == [], "the second attempt did not send while the first could still land"

    with db.connect() as conn:  # the paused attempt's settle horizon passes
        conn.execute("UPDATE effects SET lease_until = 0, horizon = 0 WHERE intent_key = :key", {"key": key})
    result = attempt(3).run(tools._issue_refund, call)
    assert result.outcome is Outcome.PERFORMED and len(world.refunds("ORD-8841")) == 1
    assert ledger.get(key).fence == 2
    assert not ledger.performed(held.effect, "re_stale", 4500, {}), "the paused attempt's write changes nothing"
    assert ledger.get(key).provider_ref == world.refunds("ORD-8841")[0]["id"]
