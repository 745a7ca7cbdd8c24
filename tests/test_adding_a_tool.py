"""A tool added by one declaration and one function gets keys, the ledger, verification and replay
safety from the gate and the effect protocol, with workflows/ untouched.

The tool is the README's worked example, `book_courier` (activities/courier.py), against a
courier API stand-in (devstack/courier_api.py) that dedupes on its own client_reference, or not.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from temporalio.client import Client
from temporalio.worker import Replayer

from activities.courier import CourierActivities, CourierGateway
from activities.db import Database
from activities.effects import ProviderTerms
from activities.world import World
from core.domain import Item, Order
from core.keys import derive_intent_key
from core.kinds import KINDS, TaskKind
from core.models import Outcome, TaskInput, TaskResult
from core.tools import REGISTRY
from devstack.courier_api import CourierAPI
from devstack.seed import seed_order
from infra.settings import Settings
from tests.helpers import finished, run, start, unique
from worker import Extensions, build_worker
from workflows import AgentTaskWorkflow

CLIENT_TIMEOUT = 1.0

DEDUPES = {"dedupes-client-reference": 600.0, "never-dedupes": None}


@pytest.fixture(params=list(DEDUPES), ids=list(DEDUPES))
def courier(request: pytest.FixtureRequest) -> Iterator[CourierAPI]:
    api = CourierAPI(dedupe_seconds=DEDUPES[request.param], stall_seconds=3 * CLIENT_TIMEOUT).start()
    yield api
    api.stop()


def courier_tools(settings: Settings, api: CourierAPI) -> CourierActivities:
    """The courier tool as a deployment opts in: its gateway and what the courier promises."""
    terms = ProviderTerms(honours_keys=api.dedupe_seconds is not None, request_timeout_seconds=CLIENT_TIMEOUT,
                          processing_window_seconds=1.0, lease_seconds=settings.effect_lease_seconds)
    return CourierActivities(Database(settings.database), CourierGateway(api.url, CLIENT_TIMEOUT), terms)


def fresh_order(world: World) -> Order:
    order = Order(order_id=unique("RET"), customer_name="Ada Byrne", customer_email="ada.byrne@example.com",
                  seller="Oakline", seller_email="orders@oakline.example",
                  items=[Item(item_id="lamp-1", description="Desk lamp", amount_cents=3900),
                         Item(item_id="shade-2", description="Lamp shade", amount_cents=1200)])
    seed_order(world.records, world.gateway, order)
    return order


def pickup_task(order_id: str, *items: str) -> TaskInput:
    """A return pickup whose scripted model asks for these bookings, one per turn."""
    calls = [{"name": "book_courier", "arguments": json.dumps({"order_id": order_id, "item_id": i})} for i in items]
    return TaskInput(task_id=unique(f"pickup-{order_id}"), scenario="return-pickup", kind=TaskKind.RETURN_PICKUP,
                     brief=f"Collect the returned items of order {order_id}.", facts={"order_id": order_id},
                     model_options={"script_calls": calls})


def pickup_rows(world: World, order_id: str) -> list[dict]:
    return [e for e in world.effects() if e["tool"] == "book_courier" and order_id in json.dumps(e)]


def book_steps(result: TaskResult) -> list:
    return [s for s in result.checkpoint.steps.values() if s.tool == "book_courier"]


def assert_ledger_matches_courier(world: World, api: CourierAPI, order_id: str) -> None:
    """Each booking of ours has one performed ledger row under its client reference, and back."""
    rows = {e["intent_key"]: e for e in world.effects() if e["tool"] == "book_courier"}
    ours = [b for b in api.bookings if b["order_id"] == order_id and b["client_reference"] in rows]
    for booking in ours:
        row = rows[booking["client_reference"]]
        assert (row["status"], row["provider_ref"]) == ("performed", booking["id"]), (row, booking)


def test_the_declaration_is_the_only_place_the_tool_is_named():
    spec = REGISTRY["book_courier"]
    assert spec.needs_key and spec.kinds == (TaskKind.RETURN_PICKUP,)
    assert [k for k, kind in KINDS.items() if "book_courier" in kind.tools] == [TaskKind.RETURN_PICKUP]
    args = {"order_id": "ORD-1", "item_id": "lamp-1"}
    one = derive_intent_key(spec.name, spec.key_fields, args, {"task_id": "ticket-1"})
    assert one == derive_intent_key(spec.name, spec.key_fields, args, {"task_id": "ticket-2"}), \
        "one pickup per item, whichever ticket asks"
    assert one != derive_intent_key(spec.name, spec.key_fields, {**args, "item_id": "shade-2"}, {"task_id": "t"})


async def test_a_worker_without_the_courier_does_not_offer_it(client: Client, settings: Settings, world: World):
    order = fresh_order(world)
    async with build_worker(client, settings):
        result = await run(client, settings, pickup_task(order.order_id, "lamp-1"))
    assert result.checkpoint.policy is not None
    assert "book_courier" not in result.checkpoint.policy.tools
    assert "get_order" in result.checkpoint.policy.tools
    assert [s.status for s in book_steps(result)] in ([], ["rejected"])
    assert pickup_rows(world, order.order_id) == []


async def test_a_booking_that_times_out_after_the_courier_accepted_it_is_found_not_booked_again(
    client: Client, settings: Settings, world: World, courier: CourierAPI,
):
    order = fresh_order(world)
    courier.stall_next = 1
    async with build_worker(client, settings, extensions=Extensions(more_tools=[courier_tools(settings, courier)])):
        result = await run(client, settings, pickup_task(order.order_id, "lamp-1"))
    assert [b["item_id"] for b in courier.bookings] == ["lamp-1"]
    assert courier.posts == 1, "nothing was sent again: the booking was looked up after the timeout"
    (step,) = book_steps(result)
    assert step.outcome is Outcome.PERFORMED and step.result.get("verified_by") == "lookup"
    assert step.intent_key == courier.bookings[0]["client_reference"]
    (row,) = pickup_rows(world, order.order_id)
    assert row["intent_key"] == step.intent_key and row["status"] == "performed"
    assert row["provider_ref"] == courier.bookings[0]["id"]


async def test_the_model_asking_again_books_once(client: Client, settings: Settings, world: World,
                                                 courier: CourierAPI):
    order = fresh_order(world)
    async with build_worker(client, settings, extensions=Extensions(more_tools=[courier_tools(settings, courier)])):
        result = await run(client, settings, pickup_task(order.order_id, "lamp-1", "lamp-1", "lamp-1"))
    assert len(courier.bookings) == 1 and courier.posts == 1
    (step,) = book_steps(result)
    assert step.asks == 3 and step.outcome in (Outcome.PERFORMED, Outcome.ALREADY_PERFORMED)
    assert len(pickup_rows(world, order.order_id)) == 1
    assert_ledger_matches_courier(world, courier, order.order_id)


async def test_one_pickup_per_item_across_tickets(client: Client, settings: Settings, world: World,
                                                  courier: CourierAPI):
    order = fresh_order(world)
    # Someone booked the shade by phone: the courier holds it under a reference that is not ours.
    courier.bookings.append({"id": "pk_phone", "order_id": order.order_id, "item_id": "shade-2", "contact": "",
                             "client_reference": "phone-call-1", "status": "booked", "created": 0.0})
    async with build_worker(client, settings, extensions=Extensions(more_tools=[courier_tools(settings, courier)])):
        first = await run(client, settings, pickup_task(order.order_id, "lamp-1"))
        second = await run(client, settings, pickup_task(order.order_id, "lamp-1", "shade-2"))
    assert sorted(b["item_id"] for b in courier.bookings) == ["lamp-1", "shade-2"], "one pickup per item"
    assert courier.posts == 1
    (lamp_first,) = book_steps(first)
    lamp_second, shade = sorted(book_steps(second), key=lambda s: s.arguments["item_id"])
    assert lamp_first.outcome is Outcome.PERFORMED
    assert lamp_second.outcome is Outcome.ALREADY_PERFORMED and lamp_second.intent_key == lamp_first.intent_key
    assert shade.outcome is Outcome.ALREADY_PERFORMED and shade.reason == "done_earlier"
    assert shade.result["external_cents"] == 1, "the phone booking used the item's one pickup"
    assert [r["status"] for r in pickup_rows(world, order.order_id)] == ["performed"]
    assert_ledger_matches_courier(world, courier, order.order_id)


async def test_a_task_using_the_tool_replays(client: Client, settings: Settings, world: World,
                                             courier: CourierAPI):
    order = fresh_order(world)
    courier.stall_next = 1
    async with build_worker(client, settings, extensions=Extensions(more_tools=[courier_tools(settings, courier)])):
        handle = await start(client, settings, pickup_task(order.order_id, "lamp-1", "lamp-1"))
        await finished(handle)
    history = await handle.fetch_history()
    assert any(e.activity_task_scheduled_event_attributes.activity_type.name == "book_courier"
               for e in history.events if e.HasField("activity_task_scheduled_event_attributes"))
    await Replayer(workflows=[AgentTaskWorkflow], data_converter=client.data_converter).replay_workflow(history)


async def test_two_tickets_at_once_book_one_pickup(client: Client, settings: Settings, world: World,
                                                  courier: CourierAPI):
    order = fresh_order(world)
    courier.stall_next = 1  # the first booking is slow to answer, so the second ticket arrives while it is in flight
    async with build_worker(client, settings, extensions=Extensions(more_tools=[courier_tools(settings, courier)])):
        handles = [await start(client, settings, pickup_task(order.order_id, "lamp-1")) for _ in range(2)]
        results = [await finished(h) for h in handles]
    assert [b["item_id"] for b in courier.bookings] == ["lamp-1"]
    outcomes = sorted(s.outcome for r in results for s in book_steps(r))
    assert outcomes == sorted([Outcome.PERFORMED, Outcome.ALREADY_PERFORMED])
    assert [r["status"] for r in pickup_rows(world, order.order_id)] == ["performed"]
    assert_ledger_matches_courier(world, courier, order.order_id)
