"""How our entry points end: an orderly shutdown, then a process exit that skips interpreter finalization.

Why not a plain return from `asyncio.run` and `sys.exit`: the Temporal SDK's Rust core runs Tokio
threads for the whole process (its Runtime cannot be closed from Python). A Tokio thread completes each
client call by taking the GIL and handing the result to the event loop (pyo3's `future_into_py`, then
`loop.call_soon_threadsafe`). The main thread can see its last await done, return from `asyncio.run`
and start finalizing the interpreter while that Tokio thread is still inside its GIL section; when it
leaves it, `PyGILState_Release` finds that its thread state is no longer the current one and the
process aborts: "Fatal Python error: PyGILState_Release: thread state ... must be current when
releasing / Python runtime state: finalizing", exit 134, after the command had done its work. Seen
under gdb on `starter.py status` (1 run in 30-40 on a busy machine): the aborting thread is a Tokio
blocking-pool thread in `pyo3_async_runtimes::generic::future_into_py_with_locals`, completing a
client call. Any entry point that used a Temporal client can hit it; the busier the machine, the
likelier.

So every entry point ends through `exit_process`: the work is finished and awaited first (a worker
has shut down, its `async with` has exited), then the atexit handlers run, logging is flushed and
closed, stdout and stderr are flushed, and `os._exit` ends the process with the code, without
finalizing an interpreter that Tokio threads may still call into.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn


def exit_process(code: int) -> NoReturn:
    """Run the atexit handlers, flush logs and the standard streams, and end the process with `code`."""
    try:
        atexit._run_exitfuncs()
        logging.shutdown()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe (`| head`) has nothing left to flush to
                pass
        os._exit(code)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as Ctrl-C is: `asyncio.run` cancels every task and each `finally` runs."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated()


def run_main(main: Callable[[], int | None]) -> NoReturn:
    """Call `main` and end the process with its exit code, the way `sys.exit(main())` would. SIGTERM
    unwinds like Ctrl-C (exit 143), so what a command started (a dev stack's servers) is stopped by its
    `finally`; a command that handles SIGTERM itself (the worker drains) sets its own handler over this."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminated)
    try:
        code = main() or 0
    except SystemExit as stop:
        if isinstance(stop.code, int) or stop.code is None:
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except Terminated:
        code = 143
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    exit_process(code)
