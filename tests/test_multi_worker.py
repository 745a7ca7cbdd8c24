"""Several worker processes on one task queue share the work; one killed mid-step leaves the
others to finish its tasks with no duplicate effect."""

from __future__ import annotations

import asyncio
import re
import signal
from pathlib import Path

from temporalio.client import Client, WorkflowHandle

from activities.db import Database
from activities.payments import StripeGateway
from activities.world import World
from core.models import Checkpoint
from devstack.scenarios import batch_ticket
from devstack.seed import seed_scenarios
from devstack.stack import STRIPE_API_KEY, Stack
from infra.settings import Settings
from tests.helpers import all_of, checkpoint, start, unique, wait_for

TICKETS = 8


async def test_two_workers_share_the_queue_and_survive_one_being_killed(
    stack: Stack, client: Client, settings: Settings, world: World, worker_env: dict[str, str], tmp_path: Path,
):
    seed_scenarios(Database(settings.database), StripeGateway(STRIPE_API_KEY, settings.stripe_api_base, 10.0),
                   batch=TICKETS)
    doomed = stack.start_worker(tmp_path / "doomed.log", {**worker_env, "CRASH_AT": "issue_refund:after_provider",
                                                          "CRASH_MARKER": str(tmp_path / "crashed")})
    steady = stack.start_worker(tmp_path / "steady.log", worker_env)
    tasks = [batch_ticket(n).model_copy(update={"task_id": unique(f"ticket-B-{n:05d}")}) for n in range(1, TICKETS + 1)]
    try:
        handles = [await start(client, settings, task) for task in tasks]
        assert await asyncio.to_thread(doomed.process.wait, 60) == -signal.SIGKILL
        ends = await all_of(_settled(h) for h in handles)
    except (AssertionError, TimeoutError):
        for log in ("doomed.log", "steady.log"):  # shown with the failure: what each worker said last
            print(f"--- {log}", *(tmp_path / log).read_text().splitlines()[-40:], sep="\n")
        raise
    finally:
        steady.stop()
    # The kill lands when one refund of the doomed worker has its answer; another of its refunds may have
    # its request on the wire then. This provider ignores idempotency keys, so a resend could pay twice
    # if that request landed late: its task honestly asks a person (unknown_outcome) instead of finishing.
    asked = [cp for cp in ends if cp.state == "awaiting_human"]
    assert all(cp.state == "completed" for cp in ends if cp not in asked), [cp.state for cp in ends]
    for cp in asked:
        assert cp.waiting_for is not None and cp.waiting_for.reason == "unknown_outcome", cp.waiting_for
        assert cp.waiting_for.tool == "issue_refund" and "got no answer" in cp.waiting_for.detail, cp.waiting_for
    held = re.search(r"\d+ of its (\d+) running attempts failed", (tmp_path / "doomed.log").read_text())
    assert held is not None, "the doomed worker's keeper said what it held at the kill"
    assert len(asked) < int(held[1]), "only the doomed worker's other attempts at the kill are asked about"
    for n, cp in enumerate(ends, start=1):
        refunds = len(world.refunds(f"B-{n:05d}"))
        assert (refunds == 1) if cp.state == "completed" else (refunds <= 1), f"ticket {n}: {refunds} refunds"
    identities = set()
    for handle in handles:
        history = await handle.fetch_history()
        identities |= {e.activity_task_started_event_attributes.identity for e in history.events
                       if e.HasField("activity_task_started_event_attributes")}
    assert len(identities) == 2, "both workers ran activities"
    assert (tmp_path / "crashed").exists()


async def _settled(handle: WorkflowHandle) -> Checkpoint:
    """The task's checkpoint once it completed or asks a person (nothing else ends a refund ticket here)."""
    async def now() -> Checkpoint | None:
        cp = await checkpoint(handle)
        return cp if cp.state in ("completed", "awaiting_human") else None
    return await wait_for(now, f"{handle.id} completed or asking a person", 120, 0.5)
