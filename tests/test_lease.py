"""Fencing of the intent lease: an attempt that holds an intent (a worker paused between its ledger
claim and its provider call) makes the next attempt wait, not send; once the lease is taken over,
the paused attempt, resumed, does not send. Against a provider that ignores idempotency keys this is
what keeps a paused worker from paying a second time."""

from __future__ import annotations

import dataclasses

import pytest
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.db import Database
from activities.tools import ToolActivities
from activities.world import World
from infra.settings import Settings
from core.keys import derive_intent_key
from core.models import Outcome, ToolInput
from core.tools import REGISTRY
from devstack.edge_control import EdgeControl


def attempt(n: int) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=n, workflow_id="refund-lease", activity_id="4",
                                   retry_policy=RetryPolicy(maximum_attempts=3))
    return env


def test_a_held_intent_is_not_sent_twice(settings: Settings, world: World, edge: EdgeControl):
    edge.configure("passthrough")
    db = Database(settings.database)
    tools = ToolActivities(db, world.gateway, approval_ceiling_cents=15000, lease_seconds=60)
    spec = REGISTRY["issue_refund"]
    args = {"order_id": "ORD-8841", "item_id": "kettle-01", "amount_cents": 4500, "currency": "usd", "reason": "x"}
    key = derive_intent_key(spec.name, spec.key_fields, args, {"task_id": "refund-lease"})
    call = ToolInput(task_id="refund-lease", tool="issue_refund", arguments=args, intent_key=key)

    first = attempt(1)
    first.run(lambda: tools._ledger.claim(key, call.task_id, call.tool, args,
                                          "refund-lease/" + first.info.workflow_run_id + "/4#1", 60))

    with pytest.raises(ApplicationError) as waited:
        attempt(2).run(tools._issue_refund, call)
    assert waited.value.type == "OutcomeUnverified" and waited.value.next_retry_delay.total_seconds() > 50
    assert world.refunds("ORD-8841") == [], "the second attempt did not send while the first held the intent"

    with db.connect() as conn:  # the paused attempt's lease runs out
        conn.execute("UPDATE effects SET lease_until = 0 WHERE intent_key = :key", {"key": key})
    result = attempt(3).run(tools._issue_refund, call)
    assert result.outcome is Outcome.PERFORMED and len(world.refunds("ORD-8841")) == 1

    with pytest.raises(ApplicationError) as fenced:  # the paused attempt resumes, just before its POST
        first.run(tools._still_mine, call)
    assert fenced.value.type == "LeaseLost" and fenced.value.non_retryable
    assert len(world.refunds("ORD-8841")) == 1
