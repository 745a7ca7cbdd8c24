"""A waiting task under a flood of what senders may send: it never outgrows its history, keeps
answering queries and the question it waits on, and one valid signed decision still pays once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.service import RPCError

from activities.authority import AuthorityActivities, Deployment, public_key_from
from activities.db import Database
from activities.world import World
from core.authority import Ceilings
from core.models import Verdict, VerifyInput
from infra.settings import Settings
from tests.approvers import signed
from tests.helpers import checkpoint, finished, running_worker, scenario_task, start, wait_for, waiting


def over_ceiling(settings: Settings) -> Settings:
    """SU-88421's $118.00 is over this ceiling: the task waits for an approval."""
    return settings.model_copy(update={"approval_ceiling_cents": 10000})


async def test_big_signals_are_refused_or_roll_the_wait_over_instead_of_ending_the_task(
    client: Client, settings: Settings, world: World,
):
    strict = over_ceiling(settings)
    async with running_worker(client, strict):
        handle = await start(client, strict, scenario_task("SU-88421"))
        asked = await waiting(handle)
        for _ in range(30):  # 15 MB in all
            await handle.signal("resolve", "x" * 500_000)
        description = await handle.describe()
        assert description.status.name == "RUNNING"

        async def rolled_over():
            try:
                cp = await checkpoint(handle)
            except RPCError:  # a continue-as-new that met newer signals is retried by the server meanwhile
                return None
            return cp if cp.runs > 1 and cp.state == "awaiting_human" else None
        cp = await wait_for(rolled_over, "the wait to go on in a fresh run", 120)
        assert cp.waiting_for.intent_key == asked.waiting_for.intent_key
        assert cp.waiting_for.deadline == asked.waiting_for.deadline, "the deadline stands"
        assert cp.escalations == 1, "the same question, not a new one"
        assert cp.decision_counts.get("ignored", 0) >= 1
        await handle.signal("resolve", signed(handle.id, cp.waiting_for.intent_key, "approve"))
        result = await finished(handle)
    assert result.state == "completed"
    assert [r["amount_cents"] for r in world.refunds("SU-88421")] == [11800]


async def test_thousands_of_refused_updates_leave_the_decide_update_working(
    client: Client, settings: Settings, world: World,
):
    """The server takes 2,000 Updates per run: what the workflow can refuse alone is refused by the
    Update's validator (never written to the history), so a person's `decide` still gets through
    after 2,100 refused ones."""
    strict = over_ceiling(settings)
    async with running_worker(client, strict):
        handle = await start(client, strict, scenario_task("SU-88421"))
        key = (await waiting(handle)).waiting_for.intent_key
        refused = 0

        async def one(i: int) -> None:
            """Sent until answered: an Update in flight when the run continues as new is aborted by the
            server, and its sender sends it again (to the new run)."""
            nonlocal refused
            for _ in range(5):
                try:
                    await handle.execute_update("decide", {"not": "a decision", "i": i})
                except WorkflowUpdateFailedError:
                    refused += 1
                    return
                except RPCError as err:
                    assert "aborted" in str(err)
        for batch in range(300):  # the server takes 10 Updates in flight per task
            await asyncio.gather(*(one(batch * 7 + i) for i in range(7)))
        assert refused == 2100
        receipt = await handle.execute_update("decide", signed(handle.id, key, "approve"))
        assert receipt["decision"] == "approve"
        result = await finished(handle)
    assert result.state == "completed"
    assert [r["amount_cents"] for r in world.refunds("SU-88421")] == [11800]


async def test_forged_decisions_cannot_starve_the_real_approvers(client: Client, settings: Settings, world: World):
    """Forty well-formed decisions claiming the real approver, signed with a key nobody trusts, sent at
    once; the real approver's signal right behind them is not refused for load, and applies."""
    strict = over_ceiling(settings)
    mallory = Ed25519PrivateKey.generate()
    async with running_worker(client, strict):
        handle = await start(client, strict, scenario_task("SU-88421"))
        key = (await waiting(handle)).waiting_for.intent_key
        forged = [signed(handle.id, key, "approve", signer=mallory, note=f"forged {i}") for i in range(40)]
        await asyncio.gather(*(handle.signal("resolve", f) for f in forged),
                             handle.signal("resolve", signed(handle.id, key, "approve", note="the real one")))
        result = await asyncio.wait_for(handle.result(), 120)  # refused for load, it would wait for ever
    assert [r["amount_cents"] for r in world.refunds("SU-88421")] == [11800]
    applied = [d for d in result.checkpoint.decisions if d.status == "applied"]
    assert [d.decision.note for d in applied] == ["the real one"]
    assert not any("too many" in (d.why or "") and d.decision and d.decision.note == "the real one"
                   for d in result.checkpoint.decisions)


def verified_once_released(settings: Settings, released: asyncio.Event) -> Callable[[VerifyInput], Awaitable[Verdict]]:
    """The worker's own `verify_decision`, answering only once `released` is set: a signature check
    still running when the wait rolls over."""
    real = AuthorityActivities(Database(settings.agent_db_path), Deployment(
        {name: public_key_from(key) for name, key in settings.approver_keys.items()},
        Ceilings(settings.approval_ceiling_cents), settings.escalation_timeout_seconds)).verify_decision

    @activity.defn(name="verify_decision")
    async def verify_decision(request: VerifyInput) -> Verdict:
        await released.wait()
        return await real(request)
    return verify_decision


async def rolled_over_by(handle: WorkflowHandle, junk_bytes: int) -> None:
    """Until the workflow task that met the junk signal has completed: the run has begun to continue as new."""
    async def met():
        events = [e async for e in handle.fetch_history_events()]
        junk = next((i for i, e in enumerate(events)
                     if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
                     and e.workflow_execution_signaled_event_attributes.input.payloads[0].ByteSize() > junk_bytes), None)
        return junk is not None and any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
                                        for e in events[junk:])
    await wait_for(met, "the junk signal to be met by a workflow task", 60)


async def test_a_decide_update_verified_while_the_wait_rolls_over_is_acted_on(
    client: Client, settings: Settings, world: World,
):
    """A person's `decide` is being verified when a junk signal fills the run's history and the wait starts
    to continue as new, which waits for its handlers to finish. The decision is valid and applies: the run
    acts on it at once (the Update's handler waits for its answer, so waiting for that handler would wait for
    ever), the caller gets the receipt and the refund is paid once."""
    strict = over_ceiling(settings)
    released = asyncio.Event()
    async with running_worker(client, strict, replace=[verified_once_released(strict, released)]):
        task = scenario_task("SU-88421").model_copy(update={"max_history_bytes": 200_000})
        handle = await start(client, strict, task)
        key = (await waiting(handle)).waiting_for.intent_key
        decide = asyncio.ensure_future(handle.execute_update("decide", signed(handle.id, key, "approve")))
        await handle.signal("resolve", "x" * 300_000)
        await rolled_over_by(handle, 200_000)
        released.set()
        receipt = await asyncio.wait_for(decide, 60)
        result = await finished(handle)
    assert receipt["decision"] == "approve" and result.state == "completed"
    assert [r["amount_cents"] for r in world.refunds("SU-88421")] == [11800]
    assert [d.status for d in result.checkpoint.decisions if d.via == "update"] == ["applied"]
