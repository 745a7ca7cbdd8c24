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
from core.models import InspectInput, Outcome, SettleInput, ToolInput
from core.tools import REGISTRY
from devstack.edge_control import EdgeControl
from infra.settings import Settings


def attempt(n: int) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=n, workflow_id="refund-lease", activity_id="4",
                                   retry_policy=RetryPolicy(maximum_attempts=3))
    return env


def _setup(settings: Settings, world: World, edge: EdgeControl,
           honours_keys: bool = False) -> tuple[ToolActivities, EffectLedger, ToolInput]:
    edge.configure("dedupe" if honours_keys else "passthrough")
    db = Database(settings.database)
    tools = ToolActivities(db, world.gateway, Ceilings(15000),
                           terms=ProviderTerms(honours_keys=honours_keys, request_timeout_seconds=5,
                                               processing_window_seconds=30))
    spec = REGISTRY["issue_refund"]
    args = {"order_id": "ORD-8841", "item_id": "kettle-01", "amount_cents": 4500, "currency": "usd", "reason": "x"}
    key = derive_intent_key(spec.name, spec.key_fields, args, {"task_id": "refund-lease"})
    return tools, EffectLedger(db), ToolInput(task_id="refund-lease", tool="issue_refund", arguments=args,
                                               intent_key=key)


def _hold(ledger: EffectLedger, call: ToolInput) -> Claimed:
    """The first attempt's claim: a worker that then paused (lease 5 s, settle horizon 40 s)."""
    now = time.time()
    held = attempt(1).run(lambda: ledger.claim(Request(
        intent_key=call.intent_key or "", task_id=call.task_id, tool=call.tool, arguments=call.arguments,
        owner="refund-lease/run/4", attempt=1, amount_cents=4500,
        holds=(Hold("item:ORD-8841/kettle-01", 4500, 4500), Hold("order:ORD-8841", 6900, 4500)),
        lease_until=now + 5, horizon=now + 40)))
    assert isinstance(held, Claimed)
    return held


def _passes(settings: Settings, call: ToolInput, what: str) -> None:
    with Database(settings.database).connect() as conn:
        conn.execute(f"UPDATE effects SET {what} = 0 WHERE intent_key = :key", {"key": call.intent_key})


def test_a_holder_paused_before_its_request_left_is_taken_over_at_its_lease(
        settings: Settings, world: World, edge: EdgeControl):
    tools, ledger, call = _setup(settings, world, edge)
    held = _hold(ledger, call)

    with pytest.raises(ApplicationError) as waited:
        attempt(2).run(tools._issue_refund, call)
    assert waited.value.type == "OutcomeUnverified" and 3 < waited.value.next_retry_delay.total_seconds() < 10, \
        "its request never got as far as leaving: the wait is its lease (send-by time), not its horizon"
    assert world.refunds("ORD-8841") == []

    _passes(settings, call, "lease_until")  # its send-by time passes: the send-by check stops it from now on
    result = attempt(3).run(tools._issue_refund, call)
    assert result.outcome is Outcome.PERFORMED and len(world.refunds("ORD-8841")) == 1
    assert ledger.get(call.intent_key or "").fence == 2
    assert not ledger.leaving(held.effect), "the paused attempt wakes: its request may not leave"
    assert not ledger.performed(held.effect, "re_stale", 4500, {}), "the paused attempt's write changes nothing"
    assert ledger.get(call.intent_key or "").provider_ref == world.refunds("ORD-8841")[0]["id"]


def test_a_request_that_may_have_left_is_never_sent_again_at_a_provider_ignoring_keys(
        settings: Settings, world: World, edge: EdgeControl):
    """Past its settle horizon, the provider shows nothing: the request may still land later than the
    provider promised, so the intent goes to a person (unknown), and nothing is sent a second time."""
    tools, ledger, call = _setup(settings, world, edge)
    held = _hold(ledger, call)
    assert ledger.leaving(held.effect), "its request was on its way when the worker paused"

    with pytest.raises(ApplicationError) as waited:
        attempt(2).run(tools._issue_refund, call)
    assert waited.value.type == "OutcomeUnverified" and waited.value.next_retry_delay.total_seconds() > 35
    assert world.refunds("ORD-8841") == [], "the second attempt did not send while the first could still land"

    _passes(settings, call, "lease_until = 0, horizon")  # its settle horizon passes with nothing at the provider
    result = attempt(3).run(tools._issue_refund, call)
    assert result.outcome is Outcome.UNKNOWN and result.reason == "may_land_late", result
    assert world.refunds("ORD-8841") == [], "nothing was sent again"
    row = ledger.get(call.intent_key or "")
    assert row.status == "unknown" and row.detail["reason"] == "may_land_late"
    assert not ledger.performed(held.effect, "re_stale", 4500, {}), "the paused attempt's write changes nothing"


def _second_ticket(call: ToolInput) -> ToolInput:
    """Another ticket about the same item: the same arguments, its own task and so its own intent key."""
    spec = REGISTRY["issue_refund"]
    key = derive_intent_key(spec.name, spec.key_fields, call.arguments, {"task_id": "refund-lease-b"})
    return call.model_copy(update={"task_id": "refund-lease-b", "intent_key": key})


def _lands_late(world: World, call: ToolInput) -> None:
    """The paused holder's request reaches the provider after all."""
    payment = world.records.order("ORD-8841").payment_intent_id
    world.gateway.refund(payment, 4500, call.intent_key or "",
                         {"task_id": call.task_id, "order_id": "ORD-8841", "item_id": "kettle-01"})


def test_a_refund_that_lands_after_a_person_said_not_performed_still_uses_up_its_item(
        settings: Settings, world: World, edge: EdgeControl):
    """A person marks a refund not performed once its horizon has passed with nothing at the provider, which
    gives its amounts back; the request lands later than the provider promised and the ticket's next ask
    finds it performed. The item is used up again: a second ticket about it sends nothing."""
    tools, ledger, call = _setup(settings, world, edge)
    held = _hold(ledger, call)
    assert ledger.leaving(held.effect)
    _passes(settings, call, "lease_until = 0, horizon")
    assert attempt(2).run(tools._issue_refund, call).reason == "may_land_late"
    said = attempt(3).run(tools._record_human_decision, SettleInput(
        task_id=call.task_id, tool=call.tool, intent_key=call.intent_key or "", arguments=call.arguments,
        status="not_performed", decided_by="ops@example.com"))
    assert said.applied, said

    _lands_late(world, call)
    again = attempt(4).run(tools._issue_refund, call)
    assert again.outcome is Outcome.ALREADY_PERFORMED, again
    assert ledger.get(call.intent_key or "").status == "performed"

    other = attempt(1).run(tools._issue_refund, _second_ticket(call))
    assert other.outcome is not Outcome.PERFORMED, other
    assert [r["amount_cents"] for r in world.refunds("ORD-8841")] == [4500], "the item was refunded once"


def test_a_refund_a_person_marks_performed_with_no_claim_of_ours_uses_up_its_item(
        settings: Settings, world: World, edge: EdgeControl):
    """The provider holds a refund under a ticket's intent key that the ledger never claimed (a request
    made before the ledger knew it, recorded by a person): it uses up its item for every other ticket."""
    tools, ledger, call = _setup(settings, world, edge)
    _lands_late(world, call)
    ref = world.refunds("ORD-8841")[0]["id"]
    said = attempt(1).run(tools._record_human_decision, SettleInput(
        task_id=call.task_id, tool=call.tool, intent_key=call.intent_key or "", arguments=call.arguments,
        status="performed", provider_ref=ref, decided_by="ops@example.com"))
    assert said.applied, said
    assert ledger.get(call.intent_key or "").status == "performed"

    other = attempt(1).run(tools._issue_refund, _second_ticket(call))
    assert other.outcome is not Outcome.PERFORMED, other
    assert [r["amount_cents"] for r in world.refunds("ORD-8841")] == [4500], "the item was refunded once"


def _landed_and_failed(world: World, edge: EdgeControl, call: ToolInput) -> str:
    """The holder's request made a refund, which the provider then failed (the card was closed)."""
    _lands_late(world, call)
    [refund] = world.refunds("ORD-8841")
    edge.fail_refund(refund["id"])
    return str(refund["id"])


def test_a_refund_the_provider_failed_is_not_performed_and_frees_its_item(
        settings: Settings, world: World, edge: EdgeControl):
    """At a provider that honours keys, an attempt that finds its intent's refund failed says not performed
    (no money moved), and the item's price is free again: another ticket about it refunds it."""
    tools, ledger, call = _setup(settings, world, edge, honours_keys=True)
    held = _hold(ledger, call)
    assert ledger.leaving(held.effect)
    ref = _landed_and_failed(world, edge, call)

    result = attempt(2).run(tools._issue_refund, call)
    assert result.outcome is Outcome.NOT_PERFORMED and result.reason == "provider_failed", result
    assert result.data["provider_ref"] == ref and not result.retryable
    row = ledger.get(call.intent_key or "")
    assert (row.status, row.provider_ref) == ("not_performed", ref)
    assert not ledger.performed(held.effect, ref, 4500, {}), "the paused holder's write changes nothing"

    other = attempt(1).run(tools._issue_refund, _second_ticket(call))
    assert other.outcome is Outcome.PERFORMED, other
    assert sorted(r["status"] for r in world.refunds("ORD-8841")) == ["failed", "succeeded"], \
        "the item was refunded once, by the second ticket"


def test_an_intent_in_doubt_whose_refund_failed_is_settled_by_the_records_and_a_person_cannot_say_performed(
        settings: Settings, world: World, edge: EdgeControl):
    """Before a person is asked, the records of a provider that honours keys settle an intent whose only
    refund failed: not performed. A person who names that failed refund as its effect is refused."""
    tools, ledger, call = _setup(settings, world, edge, honours_keys=True)
    held = _hold(ledger, call)
    assert ledger.leaving(held.effect)
    assert ledger.unknown(held.effect, {"reason": "unverified"})
    ref = _landed_and_failed(world, edge, call)

    said = attempt(1).run(tools._record_human_decision, SettleInput(
        task_id=call.task_id, tool=call.tool, intent_key=call.intent_key or "", arguments=call.arguments,
        status="performed", provider_ref=ref, decided_by="ops@example.com"))
    assert not said.applied and "failed" in (said.why or ""), said

    view = attempt(1).run(tools._inspect_intent, InspectInput(
        task_id=call.task_id, tool=call.tool, intent_key=call.intent_key or "", arguments=call.arguments))
    assert view.status == "not_performed" and ref in view.detail, view
    assert ledger.get(call.intent_key or "").status == "not_performed"
    assert ledger.live_holds([call.intent_key or ""]) == set(), "its amounts went back to the item"


def test_a_failed_refund_at_a_provider_ignoring_keys_frees_nothing_while_a_request_may_land(
        settings: Settings, world: World, edge: EdgeControl):
    """At a provider that ignores keys a failed refund of an intent says nothing of its other requests:
    one is on its way. Reading the intent settles nothing, the item stays held, another ticket refunds
    nothing, and when the request lands the item was refunded once."""
    tools, ledger, call = _setup(settings, world, edge)
    held = _hold(ledger, call)
    assert ledger.leaving(held.effect), "a request of the intent is on its way"
    _landed_and_failed(world, edge, call)  # an earlier request of it, failed

    view = attempt(2).run(tools._inspect_intent, InspectInput(
        task_id=call.task_id, tool=call.tool, intent_key=call.intent_key or "", arguments=call.arguments))
    assert view.status == "in_flight", view
    assert ledger.get(call.intent_key or "").status == "intent"
    with pytest.raises(ApplicationError) as waited:
        attempt(1).run(tools._issue_refund, _second_ticket(call))
    assert waited.value.type == "BudgetInFlight", "another ticket waits for the request in flight"

    _lands_late(world, call)
    assert sorted(r["status"] for r in world.refunds("ORD-8841")) == ["failed", "succeeded"], \
        "the item was refunded once"


def test_a_person_can_record_the_refund_made_by_hand_after_the_intents_refund_failed(
        settings: Settings, world: World, edge: EdgeControl):
    """The intent's refund failed at the provider; support refunded the item by hand. The person who marks
    the intent performed with that refund is not refused because of the failed one."""
    tools, ledger, call = _setup(settings, world, edge, honours_keys=True)
    held = _hold(ledger, call)
    assert ledger.leaving(held.effect)
    assert ledger.unknown(held.effect, {"reason": "unverified"})
    _landed_and_failed(world, edge, call)
    payment = world.records.order("ORD-8841").payment_intent_id
    by_hand = world.gateway._client.v1.refunds.create(params={  # in the dashboard: no intent key
        "payment_intent": payment, "amount": 4500, "metadata": {"order_id": "ORD-8841", "item_id": "kettle-01"}})

    said = attempt(1).run(tools._record_human_decision, SettleInput(
        task_id=call.task_id, tool=call.tool, intent_key=call.intent_key or "", arguments=call.arguments,
        status="performed", provider_ref=by_hand.id, decided_by="ops@example.com"))
    assert said.applied, said
    row = ledger.get(call.intent_key or "")
    assert (row.status, row.provider_ref) == ("performed", by_hand.id)


def _ticket(call: ToolInput, task_id: str, **arguments) -> ToolInput:
    """Another ticket's refund call on the same order: its own task, so its own intent key."""
    spec = REGISTRY["issue_refund"]
    args = {**call.arguments, **arguments}
    key = derive_intent_key(spec.name, spec.key_fields, args, {"task_id": task_id})
    return call.model_copy(update={"task_id": task_id, "arguments": args, "intent_key": key})


def test_a_refund_the_provider_fails_after_it_was_performed_frees_its_item(
        settings: Settings, world: World, edge: EdgeControl):
    """A refund made and recorded performed is failed by the provider later (the card was closed). The next
    ticket about the item reads the provider first: the failed refund holds nothing, the ledger says so,
    and that ticket refunds the item."""
    tools, ledger, call = _setup(settings, world, edge, honours_keys=True)
    first = attempt(1).run(tools._issue_refund, call)
    assert first.outcome is Outcome.PERFORMED, first
    edge.fail_refund(first.data["provider_ref"])

    other = attempt(1).run(tools._issue_refund, _second_ticket(call))
    assert other.outcome is Outcome.PERFORMED, other
    assert sorted(r["status"] for r in world.refunds("ORD-8841")) == ["failed", "succeeded"]
    row = ledger.get(call.intent_key or "")
    assert row.status == "not_performed" and row.detail["reason"] == "failed_after_performed", row


def test_a_refund_made_by_hand_and_recorded_by_a_person_holds_its_item_and_its_order(
        settings: Settings, world: World, edge: EdgeControl):
    """The intent's refund failed at the provider and gave its amounts back; support refunded the kettle by
    hand, with no item in the refund's metadata, and a person recorded it as the intent's effect. It holds
    the kettle (another ticket cannot refund the kettle's price again) and counts once against the order
    (the mugs can still be refunded); the intent answers from the ledger, not from its failed refund."""
    tools, ledger, call = _setup(settings, world, edge, honours_keys=True)
    held = _hold(ledger, call)
    assert ledger.leaving(held.effect)
    _landed_and_failed(world, edge, call)
    assert attempt(2).run(tools._issue_refund, call).reason == "provider_failed"
    payment = world.records.order("ORD-8841").payment_intent_id
    by_hand = world.gateway._client.v1.refunds.create(params={  # in the dashboard: no item, no intent key
        "payment_intent": payment, "amount": 4500, "metadata": {"order_id": "ORD-8841"}})
    said = attempt(3).run(tools._record_human_decision, SettleInput(
        task_id=call.task_id, tool=call.tool, intent_key=call.intent_key or "", arguments=call.arguments,
        status="performed", provider_ref=by_hand.id, decided_by="ops@example.com"))
    assert said.applied, said

    again = attempt(1).run(tools._issue_refund, call.model_copy(update={"task_id": call.task_id}))
    assert again.outcome in (Outcome.PERFORMED, Outcome.ALREADY_PERFORMED), again
    assert again.data["provider_ref"] == by_hand.id
    kettle_again = attempt(1).run(tools._issue_refund, _ticket(call, "refund-lease-b", amount_cents=2400))
    assert kettle_again.outcome is not Outcome.PERFORMED, kettle_again
    mugs = attempt(1).run(tools._issue_refund, _ticket(call, "refund-lease-c", item_id="mugs-02", amount_cents=2400))
    assert mugs.outcome is Outcome.PERFORMED, mugs
    assert sorted(r["amount_cents"] for r in world.refunds("ORD-8841") if r["status"] == "succeeded") == [2400, 4500]


def test_a_recorded_refund_that_fails_while_the_intents_own_request_may_land_keeps_its_item(
        settings: Settings, world: World, edge: EdgeControl):
    """The intent's own request is on its way when a person records a dashboard refund as its effect; the
    provider then fails that refund. The intent's own request may still land, so its amounts stay held
    (unknown, not not performed): another ticket cannot refund the kettle meanwhile."""
    tools, ledger, call = _setup(settings, world, edge)
    held = _hold(ledger, call)
    assert ledger.leaving(held.effect), "its own request left; its horizon is 40 s away"
    payment = world.records.order("ORD-8841").payment_intent_id
    by_hand = world.gateway._client.v1.refunds.create(params={
        "payment_intent": payment, "amount": 4500, "metadata": {"order_id": "ORD-8841"}})
    said = attempt(1).run(tools._record_human_decision, SettleInput(
        task_id=call.task_id, tool=call.tool, intent_key=call.intent_key or "", arguments=call.arguments,
        status="performed", provider_ref=by_hand.id, decided_by="ops@example.com"))
    assert said.applied, said
    edge.fail_refund(by_hand.id)

    other = attempt(1).run(tools._issue_refund, _second_ticket(call))
    assert (other.outcome, other.reason) == (Outcome.NOT_PERFORMED, "budget_in_doubt"), other
    assert ledger.get(call.intent_key or "").status == "unknown"
    assert [r["status"] for r in world.refunds("ORD-8841")] == ["failed"]
