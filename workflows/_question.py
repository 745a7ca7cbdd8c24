"""What a task asks a person, as the workflow keeps it while it waits.

A module of its own, imported through the sandbox's passthrough: the sandbox imports the workflow's
module afresh for every run, and building a dataclass there (its generated methods are compiled each
time) was an eighth of that import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.models import EscalationReason


@dataclass(frozen=True)
class Question:
    """What a person is asked: about which call (tool, arguments, decision key), why, and the detail."""

    tool: str
    arguments: dict[str, Any]
    key: str
    reason: EscalationReason
    detail: str
    keyed: bool = False  # about a call with an intent key
    ran: bool = False  # asked after the call ran (its outcome is in question), not before it

    def alert_summary(self) -> str:
        return f"{self.tool} waits for a human: {self.reason}: {self.detail[:500]}"
