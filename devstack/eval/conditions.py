"""Provider conditions and worker faults a run is put through.

Each condition sets the Stripe edge (mode and fault rules, on the ticket's first money request,
as `devstack/edge_control.py` presets do) and may name a point where the worker serving the
run is SIGKILLed (`CRASH_AT`, as the chaos run and the crash tests do) or SIGSTOPped
(`CRASH_SIGNAL=SIGSTOP`); another worker then finishes the task, and a paused one is woken afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from devstack.edge_control import FAULT_PRESETS, preset

__all__ = ["CONDITIONS", "Condition", "by_names"]


@dataclass(frozen=True)
class Condition:
    name: str
    about: str
    mode: str = "dedupe"
    fault: str | None = None
    slow_post: bool = False
    crash_at_end: bool = False
    pause_before_send: bool = False
    may_escalate: bool = False

    def rules(self, money_path: str, client_timeout: float) -> list[dict[str, Any]]:
        if self.slow_post:
            return [{"fault": "slow", "method": "POST", "path": money_path, "nth": [1],
                     "delay_seconds": client_timeout + 1.0}]
        return preset(self.fault, money_path, client_timeout) if self.fault else []

    def worker_fault(self, money_tool: str, naive_tool: bool) -> tuple[str, str] | None:
        """(the point, `SIGKILL` or `SIGSTOP`) for the worker process that serves the run first, if any.

        A kill comes where incident 3 struck: the money activity returned, Temporal never heard of it.
        A pause comes just before the provider call (after our tool claimed the intent; the naive
        tool claims nothing, so its activity's start is the same moment); the process is woken once
        another worker has finished the task.
        """
        if self.crash_at_end:
            return f"{money_tool}:end", "SIGKILL"
        if self.pause_before_send:
            return (f"{money_tool}:start" if naive_tool else f"{money_tool}:before_provider"), "SIGSTOP"
        return None


_ABOUT = {
    "timeout-after-accept": "provider accepts, answers after the client's timeout",
    "error-after-commit": "provider commits, answers 500",
    "drop-after-commit": "provider commits, connection dropped",
    "error-before-commit": "500 before the provider sees it",
    "drop-before-commit": "connection dropped before the provider sees it",
    "conflict-before-commit": "409 (key in flight) before the provider sees it",
    "unverifiable": "timeout after accept, and every lookup fails",
}

CONDITIONS: list[Condition] = [
    Condition("none", "no fault"),
    # A dropped connection gets no answer: at a provider ignoring keys (the workers' default terms) the
    # request may land later than promised, so past its horizon a person decides (`may_land_late`).
    *(Condition(name, _ABOUT[name], fault=name, may_escalate=name in ("unverifiable", "drop-before-commit"))
      for name in FAULT_PRESETS),
    Condition("slow-provider", "request reaches the provider after the client gave up", slow_post=True,
              may_escalate=True),
    Condition("keys-ignored", "provider ignores idempotency keys, timeout after accept", mode="passthrough",
              fault="timeout-after-accept"),
    Condition("worker-killed", "worker SIGKILLed after the money call returned, before Temporal recorded it",
              crash_at_end=True),
    Condition("worker-paused", "worker SIGSTOPped just before the money call, woken after another finished",
              pause_before_send=True, may_escalate=True),
]


def by_names(names: list[str]) -> list[Condition]:
    """The conditions named, in the order given; ValueError naming an unknown one."""
    known = {c.name: c for c in CONDITIONS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown condition {unknown[0]!r}; choose from {', '.join(known)}")
    return [known[n] for n in names]
