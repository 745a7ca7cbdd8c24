"""What a ticket's facts must name before its task starts: the check the starter asks the worker for.

The starter (client/facts.py) runs `check_facts` as a standalone activity on the task queue, so
the ledger's records and the provider's key stay with the worker (activities/facts.py); nothing is
started when the verdict names a problem.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from core.models import TaskKind

CHECK_FACTS_ACTIVITY = "check_facts"


class FactsCheck(BaseModel):
    kind: TaskKind
    facts: dict[str, str]


class FactsVerdict(BaseModel):
    problems: list[str] = Field(default_factory=list, description="one line each; empty: the facts hold")
