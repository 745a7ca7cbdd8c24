"""A worker process for one eval column, for the runs that kill it: `python -m devstack.eval._worker SPEC`.

Built with `worker.build_worker` like the in-process workers of the eval, so the naive tool and
the seeded-defect model are what gets killed too. Settings come from the environment; CRASH_AT
and CRASH_MARKER say where it SIGKILLs itself (activities/faults.py).
"""

from __future__ import annotations

import asyncio
import signal
import sys

from devstack.eval.columns import parse_column
from infra import connection, telemetry
from infra.exit import run_main
from infra.settings import load_settings
from worker import Extensions, build_worker


async def main(spec: str) -> None:
    settings = load_settings()
    telemetry.setup_logging()
    column = parse_column(spec)
    client = await connection.connect(settings)
    backend = column.backend(settings)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with build_worker(client, settings, backend=backend, extensions=Extensions(replace=column.replace(settings))):
        print(f"worker ready: eval column {spec} on {settings.task_queue}", flush=True)
        await stop.wait()
    await backend.aclose()


if __name__ == "__main__":
    run_main(lambda: asyncio.run(main(sys.argv[1])))
