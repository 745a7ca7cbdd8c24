"""Injected worker crashes, for tests and demos: `CRASH_AT=issue_refund:after_provider`.

The worker SIGKILLs itself the first time it reaches a named point, leaving a marker file
so the restarted worker (started without CRASH_AT, or with the marker present) goes on.
With CRASH_SIGNAL=SIGSTOP it pauses there instead, until someone sends it SIGCONT: a process
that wakes up late.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path


def crash_point(name: str) -> None:
    wanted = os.environ.get("CRASH_AT")
    if not wanted or wanted != name:
        return
    marker = os.environ.get("CRASH_MARKER")
    if marker:
        path = Path(marker)
        if path.exists():
            return
        path.write_text(name)
    # To this thread: it stops (or dies) before it runs another instruction. A signal to the process
    # may be taken by another thread, and this one would go on a moment, long enough to send.
    signal.pthread_kill(threading.get_ident(), signal.Signals[os.environ.get("CRASH_SIGNAL", "SIGKILL")])
