"""Exit codes an operator can trust: 50 CLI invocations in a row, each exit 0 with no fatal error at
interpreter exit, and a worker stopped with SIGTERM exits 0.

Before infra/exit.py about 1 run in 4 (machine load 4-9) of `status`, `list` and `resolve` aborted
after doing its work: "Fatal Python error: PyGILState_Release", exit 134.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from temporalio.client import Client

from activities.world import World
from devstack.processes import WorkerProcess
from devstack.stack import Stack
from infra.settings import Settings
from tests.helpers import run, running_worker, scenario_task

ROOT = Path(__file__).resolve().parent.parent
RUNS = 50


def cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "starter.py", *args], cwd=ROOT, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=60)


async def test_fifty_cli_invocations_exit_zero_without_a_fatal_error(client: Client, settings: Settings,
                                                                     world: World, worker_env: dict[str, str]):
    task = scenario_task("SU-88421")
    async with running_worker(client, settings):
        result = await run(client, settings, task)
        assert result.state == "completed"
        commands = [["status", task.task_id], ["list"], ["list", "--status", "completed"]]
        failures = []
        for n in range(RUNS):
            args = commands[n % len(commands)]
            done = await _in_thread(cli, args, worker_env)
            if done.returncode != 0 or "Fatal Python error" in done.stderr or "Traceback" in done.stderr:
                failures.append((n, args, done.returncode, done.stderr[-600:]))
    assert failures == [], f"{len(failures)} of {RUNS} invocations failed: {failures[:3]}"


def test_a_stopped_worker_exits_zero(stack: Stack, worker_env: dict[str, str], tmp_path: Path):
    for n in range(3):
        worker = WorkerProcess(worker_env, tmp_path / f"worker-{n}.log")
        worker.start()
        worker.wait_ready()
        code = worker.stop()
        log = worker.new_log_tail(200)
        assert code == 0 and "Fatal Python error" not in log, (code, log)
        assert all(line.startswith("{") for line in log.splitlines() if line.strip()), log


async def _in_thread(fn, *args):
    import asyncio

    return await asyncio.to_thread(fn, *args)


STARTS_A_CHILD = """
import asyncio, subprocess, sys
from infra.exit import run_main

async def main():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        print(child.pid, flush=True)
        await asyncio.sleep(600)
    finally:
        child.terminate()
        child.wait()

run_main(lambda: asyncio.run(main()))
"""


def test_sigterm_unwinds_a_command_so_what_it_started_is_stopped():
    """A dev command (chaos, week, load) stopped with SIGTERM runs its `finally` blocks, as with Ctrl-C:
    the servers it started do not outlive it. Exit 143."""
    parent = subprocess.Popen([sys.executable, "-c", STARTS_A_CHILD], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    parent.terminate()
    assert parent.wait(timeout=30) == 143
    try:
        os.kill(child, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive, f"the command's child {child} outlived it"


# Entry points that never open a Temporal client: no Tokio thread can call into their interpreter as it ends.
WITHOUT_TEMPORAL = {"migrations/__main__.py", "devstack/localstripe_server.py", "devstack/sim/__main__.py",
                    "devstack/send_by_window.py", "infra/codec.py"}


def test_every_entry_point_that_can_reach_temporal_ends_without_finalizing_the_interpreter():
    """`sys.exit(main())` after a Temporal client finalizes the interpreter while the SDK's Tokio threads may
    still complete a call into it; `devstack scenario` stopped with Ctrl-C once hung there for good (the
    runtime's drop waiting on a thread pyo3 parks for ever). Every such entry point ends through
    infra/exit.py (`run_main`, or `os._exit` after its own shutdown)."""
    sources = [p for p in ROOT.rglob("*.py") if ".venv" not in p.parts and "tests" not in p.parts]
    entry_points = {p.relative_to(ROOT).as_posix(): p.read_text() for p in sources
                    if 'if __name__ == "__main__":' in p.read_text()}
    assert set(WITHOUT_TEMPORAL) <= set(entry_points), "an entry point listed here is gone: update the list"
    unsafe = sorted(path for path, text in entry_points.items() if path not in WITHOUT_TEMPORAL
                    and "run_main(" not in text.split('if __name__ == "__main__":', 1)[1]  # infra/exit.py's
                    and "os._exit(" not in text)  # a process that ends itself (infra/liveness.py)
    assert unsafe == [], f"entry points that end by finalizing the interpreter: {unsafe}"
