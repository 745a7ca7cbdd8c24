"""Injected worker crashes, for tests, demos and chaos: `CRASH_AT=issue_refund:after_provider`.

The worker SIGKILLs itself the first time it reaches a named point, leaving a marker file
so the restarted worker (started without CRASH_AT, or with the marker present) goes on.
With CRASH_SIGNAL=SIGSTOP it pauses there instead, until someone sends it SIGCONT: a process
that wakes up late.

CRASH_ARMED=<file> lets another process aim one fault at a time (devstack/chaos.py): while the file
holds `<SIGNAL> <point>[,<point>...]`, the first thread to reach one of those points claims it (an
atomic rename, so one thread fires), writes `<point> <SIGNAL>` to `<file>.fired` and signals itself.
With no file there it does nothing; CRASH_AT is not read while CRASH_ARMED is set.

CRASH_TASKS=<prefix> limits CRASH_AT to activities of tasks whose id starts with the prefix, so a
benchmark can aim a kill at its measured ticket while other tickets load the same worker.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from temporalio import activity


def crash_point(name: str) -> None:
    armed = os.environ.get("CRASH_ARMED")
    chosen = _armed(name, armed) if armed else _wanted(name)
    if chosen is None:
        return
    # To this thread: it stops (or dies) before it runs another instruction. A signal to the process
    # may be taken by another thread, and this one would go on a moment, long enough to send.
    signal.pthread_kill(threading.get_ident(), signal.Signals[chosen])


def _wanted(name: str) -> str | None:
    wanted = os.environ.get("CRASH_AT")
    if not wanted or wanted != name:
        return None
    only = os.environ.get("CRASH_TASKS")
    if only and not (activity.in_activity() and (activity.info().workflow_id or "").startswith(only)):
        return None
    marker = os.environ.get("CRASH_MARKER")
    if marker:
        path = Path(marker)
        if path.exists():
            return None
        path.write_text(name)
    return os.environ.get("CRASH_SIGNAL", "SIGKILL")


def _armed(name: str, armed: str) -> str | None:
    try:
        sig, points = Path(armed).read_text().split()
    except (OSError, ValueError):  # not armed, or being written
        return None
    if name not in points.split(","):
        return None
    claimed = f"{armed}.{os.getpid()}.{threading.get_ident()}"
    try:
        os.rename(armed, claimed)
    except FileNotFoundError:  # another thread (or a disarm) took it first
        return None
    Path(claimed).write_text(f"{name} {sig}")
    os.rename(claimed, f"{armed}.fired")
    return sig
