"""Several worker processes on one task queue share the work; one killed mid-step leaves the
others to finish its tasks with no duplicate effect."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from temporalio.client import Client

from activities.db import Database
from activities.payments import StripeGateway
from activities.world import World
from devstack.scenarios import batch_ticket
from devstack.seed import seed_scenarios
from devstack.stack import STRIPE_API_KEY, Stack
from infra.settings import Settings
from tests.helpers import all_finished, start, unique

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
        results = await all_finished(handles, 120)
    except AssertionError:
        for log in ("doomed.log", "steady.log"):  # shown with the failure: what each worker said last
            print(f"--- {log}", *(tmp_path / log).read_text().splitlines()[-40:], sep="\n")
        raise
    finally:
        steady.stop()
    assert {r.state for r in results} == {"completed"}
    for n in range(1, TICKETS + 1):
        assert len(world.refunds(f"B-{n:05d}")) == 1, f"ticket {n}"
    identities = set()
    for handle in handles:
        history = await handle.fetch_history()
        identities |= {e.activity_task_started_event_attributes.identity for e in history.events
                       if e.HasField("activity_task_started_event_attributes")}
    assert len(identities) == 2, "both workers ran activities"
    assert (tmp_path / "crashed").exists()
