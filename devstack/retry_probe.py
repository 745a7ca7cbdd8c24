"""How long an activity's retry waits to start while a few hundred tasks run on the same worker.

    python -m devstack.retry_probe [--in-flight 300] [--probes 200] [--every 0.5] [--no-eager]
                                   [--server-config KEY=VALUE ...] [--limit 2] [--json]

A kill's interrupted step resumes as a retry (the liveness keeper fails the dead attempt at once),
so a resume is as fast as a retry's start. `make resume` under load saw two of 50 retries start 17
and 75 s late, every other about 1 s; this makes retries on purpose, hundreds of them.

On a fresh local stack, one worker in this process (our worker options) runs bare tasks
(`bench_bare.BareTaskWorkflow`, seven no-op steps) `--in-flight` at a time without pause, and beside
them `--probes` probe tasks, one every `--every` seconds: an activity whose first attempt fails
(retryable, next attempt after 0.25 s, our tools' first retry interval) and whose second returns how
long it waited, from the time the server scheduled it and from the first attempt's failure.
`--server-config` sets the dev server's dynamic config over the stack's (`SERVER_PRAGMAS` in
devstack/processes.py); `history.timerProcessorMaxPollRPS=20`, the server's default, made the
late retries. `history.timerProcessorMaxTimeShift='"100ms"'` (default 1 s, the timer queue's
look-ahead: a timer due sooner is moved past it) starts a retry 0.27 s after its failure instead of
1.0 s, and cost the harness 7-9 points of its throughput ratio in two pairs of `make load` runs
(docs/scale.md).
Exit 1 when a retry started more than `--limit` seconds after its failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.worker import Worker

from devstack.bench_bare import BareTaskWorkflow
from devstack.load import bare_step, percentile
from devstack.probe_workflow import PROBE_ACTIVITY, RETRY_AFTER, RetryProbeWorkflow
from devstack.stack import Stack, add_server_config_option
from devstack.week import BARE_STEPS
from infra.exit import run_main
from infra.settings import Settings
from worker import worker_options

QUEUE = "retry-probe"


_failed_at: dict[int, float] = {}  # probe number -> when its first attempt failed (the worker runs in this process)


@activity.defn(name=PROBE_ACTIVITY)
async def probe_step(number: int) -> list[float]:
    """[the retry's wait from its schedule time to its start, from the first attempt's failure to it]."""
    info = activity.info()
    if info.attempt == 1:
        _failed_at[number] = time.time()
        raise ApplicationError("the probe's first attempt fails on purpose", next_retry_delay=RETRY_AFTER,
                               category=ApplicationErrorCategory.BENIGN)  # benign: no warning logged
    now = time.time()
    return [now - info.current_attempt_scheduled_time.timestamp(), now - _failed_at.pop(number)]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="retry-probe-") as tmp, \
            Stack.for_tests(Path(tmp), server_config=dict(args.server_config)) as stack:
        client = await Client.connect(stack.address, data_converter=pydantic_data_converter)
        settings = Settings(temporal_address=stack.address, task_queue=QUEUE)
        options = worker_options(settings, disable_eager_activity_execution=not args.eager)
        stop = asyncio.Event()
        background = {"completed": 0}

        async def keep_in_flight(slot: int) -> None:
            n = 0
            while not stop.is_set():
                n += 1
                await client.execute_workflow(BareTaskWorkflow.run, BARE_STEPS, id=f"load-{slot}-{n}",
                                              task_queue=QUEUE)
                background["completed"] += 1

        async def probe(number: int) -> list[float]:
            return await client.execute_workflow(RetryProbeWorkflow.run, number, id=f"probe-{number}",
                                                 task_queue=QUEUE)

        async with Worker(client, task_queue=QUEUE, workflows=[BareTaskWorkflow, RetryProbeWorkflow],
                          activities=[bare_step, probe_step], **options):
            loaders = [asyncio.ensure_future(keep_in_flight(slot)) for slot in range(args.in_flight)]
            probes = []
            started = time.perf_counter()
            for number in range(args.probes):
                probes.append(asyncio.ensure_future(probe(number)))
                await asyncio.sleep(args.every)  # a steady rate of probes, not a wait for anything
            waits = await asyncio.gather(*probes)
            elapsed = time.perf_counter() - started
            stop.set()
            await asyncio.gather(*loaders)
    return {"eager": args.eager, "in_flight": args.in_flight, "probes": args.probes, "seconds": elapsed,
            "server_config": stack.server_config, "background_completed": background["completed"],
            "waits": [w[0] for w in waits], "from_failure": [w[1] for w in waits]}


def report(result: dict[str, Any], limit: float) -> str:
    def row(label: str, values: list[float]) -> str:
        ordered = sorted(values)
        return (f"| {label} | {percentile(ordered, 50):.3f} / {percentile(ordered, 99):.3f} / {ordered[-1]:.3f} | "
                f"{sum(v > limit for v in values)} |")
    config = ", ".join(f"{k}={v}" for k, v in result["server_config"].items()) or "no change"
    return "\n".join([
        f"{result['probes']} retries beside {result['in_flight']} bare tasks in flight "
        f"({result['background_completed']:,} completed in {result['seconds']:.0f} s); eager first attempts "
        f"{'on' if result['eager'] else 'off'}; the dev stack's server settings, {config}",
        "",
        f"| a retry's wait | p50 / p99 / max, s | over {limit:g} s |", "|---|---|---|",
        row("from its schedule time to its start", result["waits"]),
        row(f"from the first attempt's failure to its start (with the {RETRY_AFTER.total_seconds():g} s interval)",
            result["from_failure"])])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.retry_probe", description=__doc__.split("\n")[0])
    parser.add_argument("--in-flight", type=int, default=300, help="bare tasks kept running at once")
    parser.add_argument("--probes", type=int, default=200, help="probe tasks, each with one retry")
    parser.add_argument("--every", type=float, default=0.5, help="seconds between two probe starts")
    parser.add_argument("--no-eager", dest="eager", action="store_false",
                        help="disable eager activity execution: first attempts go through the queue too")
    add_server_config_option(parser)
    parser.add_argument("--limit", type=float, default=2.0, help="a retry waiting longer fails the run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=1) if args.json else report(result, args.limit))
    return 1 if any(w > args.limit for w in result["from_failure"]) else 0


if __name__ == "__main__":
    run_main(main)
