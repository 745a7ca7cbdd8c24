"""`make bench`: history size and replay speed of long agent tasks. A benchmark, not a test.

For tasks of 25, 100, 500 and 2,000 turns on a fresh dev server it prints, per task: runs
(continue-as-new), history events and bytes (all runs, and the largest run), bytes per turn,
and the time to replay every run with the current workflow code, as events replayed per second.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from activities.db import Database
from activities.payments import StripeGateway
from devstack.seed import seed_scenarios
from infra.settings import Settings
from core.models import TaskResult
from devstack.scenarios import long_run
from devstack.stack import STRIPE_API_KEY, Stack
from starter import start_task
from worker import build_worker
from workflows import AgentTaskWorkflow
from infra.exit import run_main

LIMIT_EVENTS, LIMIT_BYTES = 10_000, 2 * 1024 * 1024


async def measure(client: Client, settings: Settings, turns: int) -> dict:
    task = long_run(turns=turns, task_id=f"bench-{turns}")
    started = time.monotonic()
    handle = await start_task(client, settings, task)
    result: TaskResult = await handle.result()
    elapsed = time.monotonic() - started
    runs = sorted([w async for w in client.list_workflows(f'WorkflowId = "{task.task_id}"')],
                  key=lambda w: w.start_time)
    histories = [await client.get_workflow_handle(task.task_id, run_id=w.run_id).fetch_history() for w in runs]
    sizes = [sum(e.ByteSize() for e in h.events) for h in histories]
    events = [len(h.events) for h in histories]
    replayer = Replayer(workflows=[AgentTaskWorkflow], data_converter=pydantic_data_converter)
    replay_started = time.perf_counter()
    for history in histories:
        await replayer.replay_workflow(history)
    replay = time.perf_counter() - replay_started
    return {"turns": result.checkpoint.turns, "state": result.state, "runs": len(runs), "events": sum(events),
            "max_events": max(events), "bytes": sum(sizes), "max_bytes": max(sizes),
            "bytes_per_turn": sum(sizes) / turns, "replay_s": replay, "events_per_s": sum(events) / replay,
            "run_s": elapsed}


async def main(turn_counts: list[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp, Stack.for_tests(Path(tmp)) as stack:
        settings = Settings(temporal_address=stack.address, task_queue="bench", stripe_api_base=stack.stripe_url,
                            stripe_api_key=STRIPE_API_KEY, agent_db_path=Path(tmp) / "agent.db")
        seed_scenarios(Database(settings.agent_db_path), StripeGateway(STRIPE_API_KEY, stack.stripe_url, 10.0))
        client = await Client.connect(stack.address, data_converter=pydantic_data_converter)
        rows = []
        async with build_worker(client, settings):
            for turns in turn_counts:
                rows.append(await measure(client, settings, turns))
                print(f"  measured {turns} turns", flush=True)
    print()
    print("| turns | runs | events (all runs) | largest run, events | bytes (all runs) | largest run, bytes "
          "| bytes/turn | replay s | events replayed/s | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['turns']:,} | {r['runs']} | {r['events']:,} | {r['max_events']:,} | {r['bytes']:,} | "
              f"{r['max_bytes']:,} | {r['bytes_per_turn']:,.0f} | {r['replay_s']:.2f} | {r['events_per_s']:,.0f} | "
              f"{r['run_s']:.1f} |")
    worst = max(rows, key=lambda r: r["max_bytes"])
    ok = all(r["max_events"] < LIMIT_EVENTS and r["max_bytes"] < LIMIT_BYTES and r["state"] == "completed"
             for r in rows)
    print(f"\nlargest run: {worst['max_bytes']:,} bytes, {max(r['max_events'] for r in rows):,} events; "
          f"every run under 2 MB and 10,000 events: {'yes' if ok else 'NO'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("turns", nargs="*", type=int, default=[25, 100, 500, 2000])
    turns = parser.parse_args().turns
    run_main(lambda: asyncio.run(main(turns)))
