"""The payment boundary under faults, judged on the provider's records.

Incident 2 (SU-88421: the provider accepted, the client timed out, the tool said "failed",
the model asked again, a new key paid again) must end with one refund whichever layer
retries, against a provider that dedupes keys and one that ignores them.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
from temporalio.client import Client

from activities.world import World
from core.models import Outcome, TaskResult
from devstack.edge_control import EdgeControl, preset
from devstack.stack import Stack
from devstack.unsafe import naive_refund
from infra.settings import Settings
from tests.approvers import signed
from tests.helpers import finished, run, running_worker, scenario_task, start, waiting

MODES = ["dedupe", "passthrough"]
TIMEOUT = 1.0
LATE = TIMEOUT + 1.0


@pytest.fixture
def fast(settings: Settings) -> Settings:
    """A short client timeout, so that "timeout after accept" costs a second."""
    return settings.model_copy(update={"stripe_timeout_seconds": TIMEOUT})


def refund_step(result: TaskResult):
    return result.checkpoint.steps["issue_refund"]


def assert_ledger_matches_provider(world: World, task_id: str, provider: list[dict]) -> None:
    """Every performed ledger row has its provider record and every provider record its row."""
    ledger = {e["intent_key"]: e for e in world.effects(task_id) if e["tool"] in ("issue_refund", "send_payment")}
    for record in provider:
        assert record["intent_key"] in ledger, f"provider record without ledger row: {record}"
    for key, effect in ledger.items():
        if effect["status"] == "performed":
            assert [r["id"] for r in provider if r["intent_key"] == key] == [effect["provider_ref"]]


@pytest.mark.parametrize("mode", MODES)
async def test_model_asking_again_after_timeout_after_accept(mode, client: Client, fast: Settings, world: World,
                                                             edge: EdgeControl):
    edge.configure(mode, preset("timeout-after-accept", "/v1/refunds", TIMEOUT))
    task = scenario_task("SU-88421", repeat_effects=2)
    async with running_worker(client, fast):
        result = await run(client, fast, task)
    refunds = world.refunds("SU-88421")
    assert len(refunds) == 1
    step = refund_step(result)
    assert step.trail[0].startswith("ask 1: performed") and "verified by provider lookup" in step.trail[0]
    assert step.trail[1:] == ["ask 2: already_performed, from the task journal",
                              "ask 3: already_performed, from the task journal"]
    assert edge.stats()["fault:timeout_after_accept"] == 1
    assert_ledger_matches_provider(world, task.task_id, refunds)


@pytest.mark.parametrize("mode", MODES)
async def test_temporal_retry_after_timeout_after_accept(mode, client: Client, fast: Settings, world: World,
                                                         edge: EdgeControl):
    """The lookup after the timeout fails once: the activity attempt gives up, Temporal retries,
    and the retry verifies at the provider before it sends anything."""
    rules = preset("timeout-after-accept", "/v1/refunds", TIMEOUT)
    rules.append({"method": "GET", "path": "/v1/refunds", "fault": "fail", "after_rule": 0, "nth": [1]})
    edge.configure(mode, rules)
    task = scenario_task("SU-88421")
    async with running_worker(client, fast):
        result = await run(client, fast, task)
    assert len(world.refunds("SU-88421")) == 1
    assert edge.stats()["POST /v1/refunds"] == 1
    assert refund_step(result).attempts == 2
    assert refund_step(result).outcome is Outcome.PERFORMED


@pytest.mark.parametrize("mode", MODES)
async def test_sdk_retries_only_what_never_took_effect(mode, client: Client, fast: Settings, world: World,
                                                       edge: EdgeControl):
    """The SDK retries a 409 (nothing executed) with the same key, but not the timeout after it."""
    edge.configure(mode, [
        {"method": "POST", "path": "/v1/refunds", "fault": "conflict_before_commit", "nth": [1]},
        {"method": "POST", "path": "/v1/refunds", "fault": "timeout_after_accept", "nth": [2],
         "delay_seconds": LATE},
    ])
    task = scenario_task("SU-88421")
    async with running_worker(client, fast):
        result = await run(client, fast, task)
    assert len(world.refunds("SU-88421")) == 1
    stats = edge.stats()
    assert stats["POST /v1/refunds"] == 2, stats
    assert refund_step(result).attempts == 1


@pytest.mark.parametrize("mode", MODES)
async def test_negative_control_unsafe_tool_pays_twice(mode, client: Client, fast: Settings, world: World,
                                                       edge: EdgeControl):
    """Without intent keys and honest outcomes the same fault pays twice: what the protection prevents."""
    edge.configure(mode, preset("timeout-after-accept", "/v1/refunds", TIMEOUT))
    async with running_worker(client, fast, replace=[naive_refund(fast)]):
        await run(client, fast, scenario_task("SU-88421"))
    assert [r["amount_cents"] for r in world.refunds("SU-88421")] == [11800, 11800]


# fault -> (the first ask's outcome, answers until settled, what the person answers); unknown outcomes
# wait for a person. A 500 before the provider committed looks, to the client, like one after: the call
# waits out the request's settle horizon, finds nothing and, the provider having answered the request,
# sends once more itself. A connection dropped before the provider committed gets no answer at all: the
# request may still be on its way, so past its horizon the call is put to a person (`may_land_late`),
# who finds nothing at the provider and answers mark_not_performed; the call then runs again.
FAULTS = {
    "timeout-after-accept": (Outcome.PERFORMED, 1, None),
    "error-after-commit": (Outcome.PERFORMED, 1, None),
    "drop-after-commit": (Outcome.PERFORMED, 1, None),
    "error-before-commit": (Outcome.PERFORMED, 1, None),
    "drop-before-commit": (Outcome.UNKNOWN, 3, "mark_not_performed"),
    "conflict-before-commit": (Outcome.PERFORMED, 1, None),
    "unverifiable": (Outcome.UNKNOWN, 2, "mark_performed"),
    "slow-lookup": (Outcome.UNKNOWN, 2, "mark_performed"),
}


def fault_rules(name: str, path: str) -> list[dict]:
    if name == "slow-lookup":
        lookup = "/v1/refunds" if path == "/v1/refunds" else "/v1/payment_intents"
        return [*preset("timeout-after-accept", path, TIMEOUT),
                {"method": "GET", "path": lookup, "fault": "slow", "after_rule": 0, "delay_seconds": LATE}]
    return preset(name, path, TIMEOUT)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("scenario", ["SU-88421", "INV-9"])
async def test_every_fault_ends_in_an_honest_outcome_and_never_pays_twice(
    scenario, fault, mode, client: Client, fast: Settings, world: World, edge: EdgeControl,
):
    money_path = "/v1/refunds" if scenario == "SU-88421" else "/v1/payment_intents"
    edge.configure(mode, fault_rules(fault, money_path))
    task = scenario_task(scenario)
    tool = "issue_refund" if scenario == "SU-88421" else "send_payment"
    outcome, asks, answer = FAULTS[fault]
    async with running_worker(client, fast):
        handle = await start(client, fast, task)
        if outcome is Outcome.UNKNOWN:
            cp = await waiting(handle)
            step = cp.steps[tool]
            assert step.status == "unknown" and cp.waiting_for.reason == "unknown_outcome"
            assert cp.waiting_for.intent_key == step.intent_key
            edge.configure(mode)  # lift the rules so the test itself can read the provider
            assert [e["status"] for e in world.effects(task.task_id) if e["tool"] == tool] == ["unknown"]
            provider = world.refunds("SU-88421") if scenario == "SU-88421" else world.payments("INV-9")
            assert len(provider) == (answer == "mark_performed"), provider
            await handle.signal("resolve", signed(handle.id, step.intent_key, answer,
                                                  **({"provider_ref": provider[0]["id"]} if provider else {})))
        result = await finished(handle)
    edge.configure(mode)
    provider = world.refunds("SU-88421") if scenario == "SU-88421" else world.payments("INV-9")
    assert len(provider) == 1, provider
    step = result.checkpoint.steps[tool]
    assert len(step.trail) == asks, step.trail
    assert step.trail[0].startswith(f"ask 1: {outcome.value}"), step.trail
    assert step.outcome is Outcome.PERFORMED, step.trail
    assert_ledger_matches_provider(world, task.task_id, provider)


async def test_invoice_paid_once_when_worker_dies_after_provider_accepted(
    stack: Stack, client: Client, settings: Settings, world: World, worker_env: dict[str, str], tmp_path: Path,
):
    crashing = stack.start_worker(tmp_path / "crashing.log", {**worker_env, "CRASH_AT": "send_payment:after_provider",
                                                              "CRASH_MARKER": str(tmp_path / "crashed")})
    task = scenario_task("INV-9")
    handle = await start(client, settings, task)
    assert await asyncio.to_thread(crashing.process.wait, 60) == -signal.SIGKILL
    assert [p["amount_cents"] for p in world.payments("INV-9")] == [420000]
    assert [e["status"] for e in world.effects(task.task_id)] == ["intent"], "the gap: paid, not recorded"
    fresh = stack.start_worker(tmp_path / "fresh.log", worker_env)
    try:
        result = await asyncio.wait_for(handle.result(), 90)
    finally:
        fresh.stop()
    assert [p["amount_cents"] for p in world.payments("INV-9")] == [420000]
    step = result.checkpoint.steps["send_payment"]
    assert step.outcome is Outcome.PERFORMED and "verified by provider lookup" in step.trail[0]
    assert [m["recipient"] for m in world.messages(task.task_id)] == ["ap@acme.example"]
