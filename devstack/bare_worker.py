"""Bare Temporal's worker in a process of its own, as `python worker.py` runs ours: the bare side of
`make week` and `make load` (devstack/load.py `bare_worker`: `BareTaskWorkflow` and its no-op step,
with every worker option of ours), on TASK_QUEUE of the stack's environment.

    python -m devstack.bare_worker

It logs `worker ready` once it polls and stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from devstack.load import bare_worker
from infra import telemetry
from infra.exit import run_main
from infra.settings import load_settings
from worker import connect

log = logging.getLogger("worker")


async def main() -> None:
    settings = load_settings()
    telemetry.setup_logging()
    telemetry.watch_gc_pauses()
    client = await connect(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with bare_worker(client, settings.task_queue, settings):
        log.info(f"worker ready: bare Temporal on task queue {settings.task_queue}")
        await stop.wait()
    log.info("worker stopped")


if __name__ == "__main__":
    run_main(lambda: asyncio.run(main()))
