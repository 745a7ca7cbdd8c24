"""The three scenarios end to end on a real Temporal server and localstripe, judged on the
provider's records, the ledger and the messages sent, never on the model's reply."""

from __future__ import annotations

import asyncio

from temporalio.client import Client

from activities.world import World
from core.models import Outcome
from infra.settings import Settings
from tests.helpers import finished, run, running_worker, scenario_task, start


def performed(world: World, task_id: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for effect in world.effects(task_id):
        assert effect["status"] == "performed", effect
        counts[effect["tool"]] = counts.get(effect["tool"], 0) + 1
    return counts


async def test_support_ticket_refunds_once_and_tells_everyone(client: Client, settings: Settings, world: World):
    task = scenario_task("SU-88421")
    async with running_worker(client, settings):
        result = await run(client, settings, task)
    assert result.state == "completed"
    refunds = world.refunds("SU-88421")
    assert [r["amount_cents"] for r in refunds] == [11800]
    assert refunds[0]["intent_key"] == result.checkpoint.steps["issue_refund"].intent_key
    assert performed(world, task.task_id) == {"issue_refund": 1, "message_seller": 1, "schedule_pickup": 1,
                                              "notify_customer": 1}
    kinds = sorted((m["kind"], m["recipient"]) for m in world.messages(task.task_id))
    assert kinds == [("email", "maya.okafor@example.com"), ("pickup", "courier"),
                     ("seller_message", "orders@ashcombe.example")]


async def test_refund_worker_four_steps(client: Client, settings: Settings, world: World):
    task = scenario_task("refund-8841")
    async with running_worker(client, settings):
        result = await run(client, settings, task)
    assert [r["amount_cents"] for r in world.refunds("ORD-8841")] == [4500]
    assert performed(world, task.task_id) == {"issue_refund": 1, "notify_customer": 1}
    assert world.records.confirmation(task.task_id, "ORD-8841").startswith("Refunded 45.00 USD")
    steps = result.checkpoint.steps
    assert list(steps) == ["get_order", "issue_refund", "write_confirmation", "notify_customer"]
    assert all(s.status == "done" for s in steps.values())
    assert steps["issue_refund"].attempts == 1 and steps["issue_refund"].intent_key.startswith("v1:issue_refund:")


async def test_invoice_paid_once_with_remittance(client: Client, settings: Settings, world: World):
    task = scenario_task("INV-9")
    async with running_worker(client, settings):
        await run(client, settings, task)
    payments = world.payments("INV-9")
    assert [(p["amount_cents"], p["status"]) for p in payments] == [(420000, "succeeded")]
    assert [m["recipient"] for m in world.messages(task.task_id)] == ["ap@acme.example"]


async def test_model_asking_again_gets_already_performed(client: Client, settings: Settings, world: World):
    task = scenario_task("refund-8841", repeat_effects=2, extra_refund_items=["mugs-02"])
    async with running_worker(client, settings):
        result = await run(client, settings, task)
    refunds = sorted(r["amount_cents"] for r in world.refunds("ORD-8841"))
    assert refunds == [2400, 4500], "a different item is a new intent; a repeat is not"
    first, second = result.checkpoint.steps["issue_refund"], result.checkpoint.steps["issue_refund#2"]
    assert first.intent_key != second.intent_key
    assert first.outcome is Outcome.ALREADY_PERFORMED and second.outcome is Outcome.ALREADY_PERFORMED
    assert len({r["intent_key"] for r in world.refunds("ORD-8841")}) == 2


async def test_same_payment_in_a_second_task_is_already_performed(client: Client, settings: Settings,
                                                                  world: World):
    async with running_worker(client, settings):
        await run(client, settings, scenario_task("INV-9"))
        second = await run(client, settings, scenario_task("INV-9"))
    assert len(world.payments("INV-9")) == 1
    assert second.checkpoint.steps["send_payment"].outcome is Outcome.ALREADY_PERFORMED


async def test_starting_the_same_task_twice_runs_it_once(client: Client, settings: Settings, world: World):
    task = scenario_task("SU-88421")
    first, second = await asyncio.gather(start(client, settings, task), start(client, settings, task))
    assert first.result_run_id == second.result_run_id
    async with running_worker(client, settings):
        await finished(first)
        again = await start(client, settings, task)
        assert (await finished(again)).state == "completed"
    runs = [w async for w in client.list_workflows(f'WorkflowId = "{task.task_id}"')]
    assert len(runs) == 1
    assert len(world.refunds("SU-88421")) == 1
