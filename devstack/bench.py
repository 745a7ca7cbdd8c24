"""`make bench`: history size and replay speed of long agent tasks, beside bare Temporal. A benchmark,
not a test.

For tasks of 25, 100, 500, 2,000 and 10,000 turns on a fresh dev server it prints, per task: runs
(continue-as-new), history events and bytes (all runs, and the largest run), bytes per turn, the
time to replay every run with the current workflow code (events replayed per second) and the wall
time. Beside each, the bare baseline of the same run: `bench_bare.BareTaskWorkflow` with as many
no-op activities as the agent task ran (model turns and tool calls), continuing as new every 1,000
activities (about 6,000 events), as a long task must.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, Worker

from activities.db import Database
from activities.payments import StripeGateway
from client import start_task
from core.models import TaskResult
from devstack.bench_bare import BareTaskWorkflow
from devstack.load import bare_step
from devstack.scenarios import long_run
from devstack.seed import seed_scenarios
from devstack.stack import STRIPE_API_KEY, Stack
from infra.bytecode import ensure_bytecode
from infra.exit import run_main
from infra.settings import Settings
from worker import build_worker
from workflows import AgentTaskWorkflow

LIMIT_EVENTS, LIMIT_BYTES = 10_000, 2 * 1024 * 1024
BARE_PER_RUN = 1_000


async def histories(client: Client, workflow_id: str) -> list:
    runs = sorted([w async for w in client.list_workflows(f'WorkflowId = "{workflow_id}"')],
                  key=lambda w: w.start_time)
    return [await client.get_workflow_handle(workflow_id, run_id=w.run_id).fetch_history() for w in runs]


async def figures(histories_: list, workflow: type, turns: int, wall: float) -> dict[str, Any]:
    sizes = [sum(e.ByteSize() for e in h.events) for h in histories_]
    events = [len(h.events) for h in histories_]
    replayer = Replayer(workflows=[workflow], data_converter=pydantic_data_converter)
    started = time.perf_counter()
    for history in histories_:
        await replayer.replay_workflow(history)
    replay = time.perf_counter() - started
    return {"runs": len(histories_), "events": sum(events), "max_events": max(events), "bytes": sum(sizes),
            "max_bytes": max(sizes), "bytes_per_turn": sum(sizes) / turns, "replay_s": replay,
            "events_per_s": sum(events) / replay, "run_s": wall}


async def measure(client: Client, settings: Settings, turns: int) -> dict[str, Any]:
    task = long_run(turns=turns, task_id=f"bench-{turns}")
    started = time.monotonic()
    handle = await start_task(client, settings, task)
    result: TaskResult = await handle.result()
    harness = await figures(await histories(client, task.task_id), AgentTaskWorkflow, turns,
                            time.monotonic() - started)
    steps = result.checkpoint.turns + sum(result.checkpoint.calls.values())
    started = time.monotonic()
    bare: WorkflowHandle = await client.start_workflow(BareTaskWorkflow.run, args=[steps, BARE_PER_RUN],
                                                       id=f"bare-{turns}", task_queue="bench-bare")
    await bare.result()
    baseline = await figures(await histories(client, f"bare-{turns}"), BareTaskWorkflow, turns,
                             time.monotonic() - started)
    return {"turns": result.checkpoint.turns, "steps": steps, "state": result.state, "harness": harness,
            "bare": baseline}


def table(rows: list[dict[str, Any]]) -> str:
    def pair(r: dict, key: str, fmt: str) -> str:
        return f"{format(r['harness'][key], fmt)} / {format(r['bare'][key], fmt)}"
    lines = ["each cell: harness / bare Temporal (as many no-op activities, continuing as new every "
             f"{BARE_PER_RUN:,})", "",
             "| turns | steps | runs | events (all runs) | largest run, events | bytes (all runs) | largest run, bytes "
             "| bytes/turn | replay s | events replayed/s | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['turns']:,} | {r['steps']:,} | {pair(r, 'runs', 'd')} | {pair(r, 'events', ',')} | "
                     f"{pair(r, 'max_events', ',')} | {pair(r, 'bytes', ',')} | {pair(r, 'max_bytes', ',')} | "
                     f"{pair(r, 'bytes_per_turn', ',.0f')} | {pair(r, 'replay_s', '.2f')} | "
                     f"{pair(r, 'events_per_s', ',.0f')} | {pair(r, 'run_s', '.1f')} |")
    worst = max(r["harness"]["max_bytes"] for r in rows)
    ok = all(r["harness"]["max_events"] < LIMIT_EVENTS and r["harness"]["max_bytes"] < LIMIT_BYTES
             and r["state"] == "completed" for r in rows)
    lines += ["", f"largest harness run: {worst:,} bytes, {max(r['harness']['max_events'] for r in rows):,} events; "
                  f"every task completed with every run under 2 MB and 10,000 events: {'yes' if ok else 'NO'}"]
    return "\n".join(lines)


async def main(turn_counts: list[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp, Stack.for_tests(Path(tmp)) as stack:
        settings = Settings(temporal_address=stack.address, task_queue="bench", stripe_api_base=stack.stripe_url,
                            stripe_api_key=STRIPE_API_KEY, agent_db_path=Path(tmp) / "agent.db")
        seed_scenarios(Database(settings.agent_db_path), StripeGateway(STRIPE_API_KEY, stack.stripe_url, 10.0))
        client = await Client.connect(stack.address, data_converter=pydantic_data_converter)
        ensure_bytecode(BareTaskWorkflow)
        rows = []
        async with build_worker(client, settings), Worker(client, task_queue="bench-bare",
                                                          workflows=[BareTaskWorkflow], activities=[bare_step]):
            for turns in turn_counts:
                rows.append(await measure(client, settings, turns))
                print(f"  measured {turns} turns", flush=True)
    print()
    print(table(rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("turns", nargs="*", type=int, default=[25, 100, 500, 2000, 10000])
    turns = parser.parse_args().turns
    run_main(lambda: asyncio.run(main(turns)))
