"""Provider conditions and worker faults a run is put through.

Each condition sets the Stripe edge (mode and fault rules, on the ticket's first money request,
as `devstack/edge_control.py` presets do) and may name a point where the worker serving the
run is SIGKILLed (`CRASH_AT`, as the chaos run and the crash tests do); a fresh worker then
finishes the task.
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
    may_escalate: bool = False

    def rules(self, money_path: str, client_timeout: float) -> list[dict[str, Any]]:
        if self.slow_post:
            return [{"fault": "slow", "method": "POST", "path": money_path, "nth": [1],
                     "delay_seconds": client_timeout + 1.0}]
        return preset(self.fault, money_path, client_timeout) if self.fault else []

    def crash_point(self, money_tool: str) -> str | None:
        """The eviction of incident 3: the money activity returned, Temporal never heard of it."""
        return f"{money_tool}:end" if self.crash_at_end else None


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
    *(Condition(name, _ABOUT[name], fault=name, may_escalate=name == "unverifiable") for name in FAULT_PRESETS),
    Condition("slow-provider", "request reaches the provider after the client gave up", slow_post=True,
              may_escalate=True),
    Condition("keys-ignored", "provider ignores idempotency keys, timeout after accept", mode="passthrough",
              fault="timeout-after-accept"),
    Condition("worker-killed", "worker SIGKILLed after the money call returned, before Temporal recorded it",
              crash_at_end=True),
]


def by_names(names: list[str]) -> list[Condition]:
    """The conditions named, in the order given; ValueError naming an unknown one."""
    known = {c.name: c for c in CONDITIONS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown condition {unknown[0]!r}; choose from {', '.join(known)}")
    return [known[n] for n in names]
