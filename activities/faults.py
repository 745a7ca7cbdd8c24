"""Injected worker crashes and pauses, for tests and demos: `CRASH_AT=issue_refund:after_provider`
SIGKILLs the worker, `PAUSE_AT=issue_refund:before_provider` SIGSTOPs it (a paused process that
may wake up later and go on, as a descheduled pod or a laptop lid does).

The worker does so the first time it reaches a named point, leaving a marker file
so the restarted worker (started without CRASH_AT, or with the marker present) goes on.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

_SIGNALS = (("CRASH_AT", signal.SIGKILL), ("PAUSE_AT", signal.SIGSTOP))


def crash_point(name: str) -> None:
    for variable, sig in _SIGNALS:
        if os.environ.get(variable) != name:
            continue
        marker = os.environ.get("CRASH_MARKER")
        if marker:
            path = Path(marker)
            if path.exists():
                return
            path.write_text(name)
        os.kill(os.getpid(), sig)
